"""Entry point of one SQL sandbox worker process: `main`, started by `worker_pool` with the limit LIMIT in argv.

The worker limits its own address space to LIMIT bytes (``RLIMIT_AS``; core
dumps off) before importing anything large, says it is ready, then answers
requests from its standard input (see `worker_protocol`) one at a time until
the input closes (its parent closed the pool or died). Every task error
becomes an ``("error", message)`` reply; the worker itself never stops on one.
Its deadline is enforced from outside: the parent kills a worker that answers
late (`worker_pool`).
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from typing import Any, BinaryIO


def _limit_resources(address_space_bytes: int) -> None:
    """Caps this process's virtual memory and switches core dumps off."""
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    """Reads `size` bytes, or returns None at end of input."""
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _answer(request: Any) -> tuple[str, Any]:
    """Runs one request; any failure becomes an error reply naming its type."""
    from reward_fns.text_to_sql.sql_tasks import TASKS

    try:
        task_name, kwargs = request
        return "ok", TASKS[task_name](**kwargs)
    except MemoryError:
        return "error", "the SQL worker ran out of memory (its address-space limit)"
    except Exception as error:  # a task's own failure is data for the verifier info, never fatal here
        return "error", f"{type(error).__name__}: {error}"


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answers framed requests until the input closes."""
    from reward_fns.text_to_sql.worker_protocol import HEADER, decode_body, encode_frame

    replies.write(encode_frame(("ready", os.getpid())))
    replies.flush()
    while (header := _read_exactly(requests, HEADER.size)) is not None:
        body = _read_exactly(requests, HEADER.unpack(header)[0])
        if body is None:
            return
        replies.write(encode_frame(_answer(decode_body(body))))
        replies.flush()


def main() -> None:
    """Limits resources, imports the tasks (sqlglot, sqlite3) and serves the parent."""
    _limit_resources(int(sys.argv[1]))
    # The replies get a private copy of stdout; stdout itself then points at stderr, so
    # that a stray print (ours or a library's) cannot corrupt the frames.
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    # sqlglot logs a warning for each statement it falls back to parsing as an opaque command
    # (EXPLAIN, ...); a policy can emit thousands, and the verifier info says what matters.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    import reward_fns.text_to_sql.sql_tasks  # noqa: F401  (imported before "ready": the parent's deadline starts then)

    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
