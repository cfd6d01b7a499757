"""What one worker process does: `serve` a family's ``TASKS`` to its parent, one request at a time.

Workers are forked by their pool's zygote (`zygote`), which first runs `prepare_process`: it limits
its own address space to LIMIT bytes (``RLIMIT_AS``) and the size of any file it writes
(``RLIMIT_FSIZE``: SQLite's temporary files), switches core dumps off and sends stray prints to
standard error, before importing the family's task module (a module with a ``TASKS`` dict of
plain-data functions, e.g. ``reward_fns.text_to_sql.sql_tasks``). A worker inherits all of that
and answers requests from its request pipe (see `protocol`) until the pipe closes (its parent
closed the pool or died). Every task error becomes an ``("error", message)`` reply; the worker
itself never stops on one.

Deadlines are enforced twice. Inside, a request may carry a deadline: an interval timer
(``SIGALRM``) then raises `TaskDeadline` in the task when it passes, and the worker answers
``("timeout", message)`` and stays warm for the next request (Python-level work such as
NLTK's tokenizers stops within milliseconds). Outside, the parent kills a worker that answers
late anyway, e.g. one stuck in a single C call such as SQLite's ``printf`` or ``ast.parse`` (`pool`).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

# Longest log message a worker writes: checkers log the whole response (IFEval's language check
# logs "Unable to detect language for text ..." with all 256 KiB of a hostile answer).
MAX_LOG_MESSAGE_CHARS = 2_000
# Largest file the worker may write. It opens databases read-only, so this bounds SQLite's
# temporary files: a big ORDER BY would otherwise spill hundreds of MB to the temporary folder within a deadline.
MAX_TEMP_FILE_BYTES = 256 * 1024**2


def _limit_resources(address_space_bytes: int) -> None:
    """Caps this process's virtual memory and file sizes, and switches core dumps off.

    Past the file-size limit a write fails with EFBIG (SQLite: "disk I/O error") instead of
    raising SIGXFSZ, which would kill the worker.
    """
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_TEMP_FILE_BYTES, MAX_TEMP_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class _ShortenedMessages(logging.Filter):
    """Cuts a log message to `MAX_LOG_MESSAGE_CHARS`, saying how much was left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if len(text) > MAX_LOG_MESSAGE_CHARS:
            left_out = len(text) - MAX_LOG_MESSAGE_CHARS
            record.msg = f"{text[:MAX_LOG_MESSAGE_CHARS]} ... [{left_out:,} characters left out]"
            record.args = None
        return True


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


class TaskDeadline(BaseException):
    """Raised in a task by the interval timer at its deadline.

    A BaseException, so that a checker's own ``except Exception`` cannot swallow it.
    """


def _raise_task_deadline(signum: int, frame: Any) -> None:
    raise TaskDeadline


def _answer(tasks: Mapping[str, Callable[..., Any]], request: Any) -> tuple[str, Any]:
    """Runs one request ``(task_name, kwargs[, deadline_s])``; any failure becomes an error reply."""
    try:
        task_name, kwargs, *deadline = request
        deadline_s = deadline[0] if deadline else None
        try:
            if deadline_s:
                signal.setitimer(signal.ITIMER_REAL, deadline_s)
            return "ok", tasks[task_name](**kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
    except TaskDeadline:
        return "timeout", f"stopped checking at the {deadline_s:g} s deadline"
    except MemoryError:
        return "error", "the worker ran out of memory (its address-space limit)"
    except Exception as error:  # a task's own failure is data for the verifier info, never fatal here
        return "error", f"{type(error).__name__}: {error}"


def serve(tasks: Mapping[str, Callable[..., Any]], requests: BinaryIO, replies: BinaryIO) -> None:
    """Answers framed requests with `tasks` until the input closes."""
    from reward_fns.process_pool.protocol import HEADER, decode_body, encode_frame

    signal.signal(signal.SIGALRM, _raise_task_deadline)
    replies.write(encode_frame(("ready", os.getpid())))
    replies.flush()
    while (header := _read_exactly(requests, HEADER.size)) is not None:
        body = _read_exactly(requests, HEADER.unpack(header)[0])
        if body is None:
            return
        try:
            request = decode_body(body)
        except Exception as error:  # a request that is not plain data is answered, never fatal to the worker
            replies.write(encode_frame(("error", f"unreadable request: {type(error).__name__}: {error}")))
        else:
            replies.write(encode_frame(_answer(tasks, request)))
        replies.flush()


def prepare_process(address_space_bytes: int) -> None:
    """Limits resources and routes output: what every worker process has before any family import.

    Standard output then points at standard error, so that a stray print (ours or a library's)
    cannot reach a reply pipe; log messages are shortened (`MAX_LOG_MESSAGE_CHARS`).
    """
    _limit_resources(address_space_bytes)
    os.dup2(2, 1)
    # sqlglot logs a warning for each statement it falls back to parsing as an opaque command
    # (EXPLAIN, ...); a policy can emit thousands, and the verifier info says what matters.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ShortenedMessages())
    logging.basicConfig(handlers=[handler], level=logging.WARNING, format="%(levelname)s:%(name)s: %(message)s")
