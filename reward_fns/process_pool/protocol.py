"""The wire format between the reward process and its worker processes.

A message is one frame: an 8-byte big-endian length, then a pickle of plain
data (str, bytes, int, float, bool, None, tuple, list, dict). Frames are read
with `PlainDataUnpickler`, which refuses to look up any class or function, so a
worker that SQLite's bugs or a hostile response might subvert still cannot make its
parent run code by what it sends back (the pickle "restricting globals" recipe).

Requests: ``(task_name, kwargs, deadline_s)``. Replies: ``("ok", value)``, ``("error", message)``
or ``("timeout", message)`` (the worker's own timer stopped the task at ``deadline_s``).
The worker's first frame is ``("ready", pid)``, sent once its imports are done.
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

HEADER = struct.Struct(">Q")
# Largest reply the parent accepts: a result may hold `sandbox.MAX_RESULT_BYTES` of values
# (32 MB) plus per-value overhead; anything larger means the worker misbehaves.
MAX_FRAME_BYTES = 128 * 1024 * 1024


class PlainDataUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any reference to a class or function is an error."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: worker frames are plain data only")


def encode_frame(message: Any) -> bytes:
    """The bytes of one frame holding `message` (plain data)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> Any:
    """The message of one frame's body, read with `PlainDataUnpickler`."""
    return PlainDataUnpickler(io.BytesIO(body)).load()
