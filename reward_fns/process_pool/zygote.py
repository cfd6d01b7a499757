"""A pool's zygote: one process that imports a family's task module once and forks ready workers.

The rules in full: ``docs/reward_fns.md`` (``reward_fns/process_pool/zygote.py``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reward_fns.process_pool.protocol import HEADER, decode_body, encode_frame

# Each command and reply is one small packet.
MAX_PACKET_BYTES = 4096
# How long the pool waits for the zygote to answer a fork or a reap (beyond the reap's own wait).
COMMAND_TIMEOUT_S = 10.0
# Set in the zygote's environment: libraries that would start threads at import start none.
SINGLE_THREADED_ENVIRONMENT = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",  # pyarrow's jemalloc (pandas imports pyarrow)
}
_REAP_POLL_S = 0.002
# How often the zygote looks for released workers that have exited, while it has any.
RELEASED_REAP_INTERVAL_S = 0.05
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# The zygote imports this very copy of the package: sys.path[0] (the caller's working directory
# under -c, which might hold another checkout or a stray sqlglot.py) becomes this package's root.
_ZYGOTE_BOOTSTRAP = (
    f"import sys; sys.path[0] = {_PACKAGE_ROOT!r}; from reward_fns.process_pool.zygote import main; main()"
)


def _packet(message: tuple[Any, ...]) -> bytes:
    """One command or reply: the body of a `protocol` frame (a packet keeps its own length)."""
    return encode_frame(message)[HEADER.size :]


class ZygoteError(Exception):
    """The zygote exited, did not answer in time, or answered something else; the message says which."""


class PendingFork:
    """A fork command sent by `Zygote.fork_soon` whose answer is read later: `pid` or `failure` once read."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.failure: str | None = None


class Zygote:
    """The pool's handle on its zygote process: start, fork a worker, reap a worker, close.

    Methods may be called from several threads (one command at a time). After any failure the
    zygote is killed and `broken` holds the reason; every later command raises `ZygoteError`.

    Args:
        memory_limit_bytes: Address-space limit of the zygote and so of every worker.
        tasks_module: The module it imports (its ``TASKS`` dict names the tasks).
    """

    def __init__(self, memory_limit_bytes: int, tasks_module: str) -> None:
        self.commands, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _ZYGOTE_BOOTSTRAP, str(memory_limit_bytes), tasks_module],
                stdin=zygote_end.fileno(),
                env={**os.environ, **SINGLE_THREADED_ENVIRONMENT},
                start_new_session=True,
            )
        finally:
            zygote_end.close()
        self.pid = self.process.pid
        self.started_at = time.monotonic()
        self.broken: str | None = None
        self._ready = False
        self._lock = threading.Lock()
        self._releases: list[int] = []  # killed workers to hand over for reaping
        self._pending: list[PendingFork] = []  # forks sent by fork_soon whose answers are not read yet

    @property
    def ready(self) -> bool:
        """Whether the zygote has said it is ready (its imports are done)."""
        return self._ready

    def usable(self) -> bool:
        """Whether commands may still work: not broken, not closed, and the process runs."""
        return self.broken is None and self.process.poll() is None

    def fork(self, requests_fd: int, replies_fd: int, startup_timeout_s: float) -> int:
        """Forks a worker serving on the two pipe ends (the caller keeps and closes its copies); its pid.

        Waits for the zygote's readiness first (its imports: up to `startup_timeout_s` from its start).

        Raises:
            ZygoteError: The zygote exited, was not ready in time or refused.
        """
        with self._lock:
            self._wait_ready(startup_timeout_s)
            reply = self._command(("fork",), [requests_fd, replies_fd], COMMAND_TIMEOUT_S)
            if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "forked"):
                raise self._fail(f"it answered {reply!r:.200} to a fork")
            return int(reply[1])

    def fork_soon(self, requests_fd: int, replies_fd: int) -> PendingFork | None:
        """Sends a fork command without waiting for its answer (`collect` reads it); None if nothing was sent.

        Sent only when the zygote is ready, no other command is under way and the socket takes the
        command at once: the caller never waits. The zygote answers commands in order, so the answer
        is read before the next command's (by `collect` or that command).
        """
        if not self._ready or not self._lock.acquire(blocking=False):
            return None
        try:
            self._send_releases()
            if self.broken is not None:
                return None
            self.commands.settimeout(0.0)
            try:
                socket.send_fds(self.commands, [_packet(("fork",))], [requests_fd, replies_fd])
            except BlockingIOError:
                return None
            except OSError as error:
                self._fail(f"it could not take a command ({error})")
                return None
            pending = PendingFork()
            self._pending.append(pending)
            return pending
        except ZygoteError:
            return None
        finally:
            self._lock.release()

    def collect(self, pending: PendingFork) -> int:
        """The pid of a worker forked by `fork_soon`, reading the zygote's answer if not read yet.

        Raises:
            ZygoteError: The zygote refused the fork, exited or did not answer.
        """
        with self._lock, contextlib.suppress(ZygoteError):  # the failure is recorded in `pending`
            self._collect_pending()
        if pending.pid is None:
            raise ZygoteError(pending.failure or "the zygote never answered the fork")
        return pending.pid

    def _collect_pending(self) -> None:
        """Reads the answers to the forks sent by `fork_soon` (under the lock), in the order sent."""
        while self._pending:
            pending = self._pending[0]
            try:
                reply = self._receive(COMMAND_TIMEOUT_S, "an answer to 'fork'")
                if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "forked"):
                    raise self._fail(f"it answered {reply!r:.200} to a fork")
            except ZygoteError as error:
                for unanswered in self._pending:
                    unanswered.failure = str(error)
                self._pending.clear()
                raise
            pending.pid = int(reply[1])
            self._pending.pop(0)

    def reap(self, pid: int, wait_s: float) -> int:
        """Waits up to `wait_s` for a worker to exit, kills it otherwise; its return code (-N: signal N).

        Raises:
            ZygoteError: The zygote is gone or did not answer (the worker is then its orphan).
        """
        with self._lock:
            reply = self._command(("reap", pid, float(wait_s)), [], wait_s + COMMAND_TIMEOUT_S)
            if not (isinstance(reply, tuple) and len(reply) == 3 and reply[:2] == ("reaped", pid)):
                raise self._fail(f"it answered {reply!r:.200} to a reap")
            return int(reply[2])

    def release(self, pid: int) -> None:
        """Hands a killed worker to the zygote to reap in the background; never waits.

        The command is sent now if no other command is under way and the socket takes it at once,
        else before the next command.
        """
        self._releases.append(pid)
        if self._lock.acquire(blocking=False):
            try:
                self._send_releases()
            except ZygoteError:
                pass  # the zygote is gone: the worker, already killed, is reaped by init
            finally:
                self._lock.release()

    def _send_releases(self) -> None:
        """Sends the queued releases that the socket takes without waiting (under the lock)."""
        if self.broken is not None:
            self._releases.clear()
            return
        self.commands.settimeout(0.0)
        while self._releases:
            try:
                self.commands.send(_packet(("release", self._releases[0])))
            except BlockingIOError:
                return
            except OSError as error:
                raise self._fail(f"it could not take a command ({error})") from None
            self._releases.pop(0)

    def close(self, wait_s: float) -> None:
        """Closes the command socket (the zygote kills its workers and exits); kills it after `wait_s`."""
        with self._lock:
            self.broken = self.broken or "closed"
            self.commands.close()
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def forget(self) -> None:
        """In a forked child of the pool's process: closes the child's copy of the socket only."""
        self.broken = self.broken or "forgotten after a fork"
        with contextlib.suppress(OSError):
            self.commands.close()

    def returncode_text(self) -> str:
        """How the zygote process ended (or that it still runs)."""
        code = self.process.poll()
        if code is None:
            return "still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return signal.Signals(-code).name
        return f"exit status {code}"

    def _wait_ready(self, startup_timeout_s: float) -> None:
        if self._ready:
            return
        left = startup_timeout_s - (time.monotonic() - self.started_at)
        message = self._receive(left, "its ready signal")
        if not (isinstance(message, tuple) and message[:1] == ("ready",)):
            raise self._fail(f"it sent {message!r:.200} instead of its ready signal")
        self._ready = True

    def _command(self, message: tuple[Any, ...], fds: list[int], timeout_s: float) -> Any:
        self._send_releases()
        self._collect_pending()
        if self.broken is not None:
            raise ZygoteError(f"the zygote is unusable ({self.broken})")
        self.commands.settimeout(timeout_s)
        try:
            socket.send_fds(self.commands, [_packet(message)], fds)
        except OSError as error:
            raise self._fail(f"it could not take a command ({error})") from None
        return self._receive(timeout_s, f"an answer to {message[0]!r}")

    def _receive(self, timeout_s: float, what: str) -> Any:
        if self.broken is not None:
            raise ZygoteError(f"the zygote is unusable ({self.broken})")
        self.commands.settimeout(max(timeout_s, 0.0))
        try:
            packet = self.commands.recv(MAX_PACKET_BYTES)
        except TimeoutError:
            raise self._fail(f"it sent no {what} within {timeout_s:g} s") from None
        except OSError as error:
            raise self._fail(f"its socket failed ({error})") from None
        if not packet:
            self.process.wait()
            raise self._fail(f"it exited ({self.returncode_text()}) before sending {what}")
        try:
            return decode_body(packet)
        except Exception as error:  # anything a subverted zygote might send
            raise self._fail(f"it sent an unreadable packet ({type(error).__name__}: {error})") from None

    def _fail(self, reason: str) -> ZygoteError:
        """Marks the zygote broken and kills it (its workers see their pipes close); the error to raise."""
        self.broken = reason
        with contextlib.suppress(OSError):
            self.commands.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        return ZygoteError(reason)


# --- the zygote process itself ---------------------------------------------------------------


def _thread_count() -> int:
    """Threads of this process, as the kernel counts them (libraries' native threads included)."""
    return len(os.listdir("/proc/self/task"))


def _reply(commands: socket.socket, message: tuple[Any, ...]) -> None:
    commands.settimeout(None)  # a reply is never dropped for the release-reaping interval
    commands.send(_packet(message))


def _run_worker(tasks: Mapping[str, Callable[..., Any]], commands: socket.socket, fds: list[int]) -> None:
    """In a freshly forked worker: serves requests until its request pipe closes, then exits."""
    from reward_fns.process_pool.worker import serve

    code = 0
    try:
        commands.close()
        random.seed()  # a fresh interpreter's seed, not the zygote's sequence shared by every worker
        requests = os.fdopen(fds[0], "rb")
        replies = os.fdopen(fds[1], "wb", buffering=0)
        serve(tasks, requests, replies)
    except BrokenPipeError:
        pass  # the pool closed or died mid-reply
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _reap(pid: int, wait_s: float) -> int:
    """Waits up to `wait_s` for a child to exit, else kills it; reaps it; its return code."""
    give_up = time.monotonic() + wait_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= give_up:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        time.sleep(_REAP_POLL_S)


def _serve_commands(tasks: Mapping[str, Callable[..., Any]], commands: socket.socket) -> None:
    """Answers fork and reap commands until the socket closes, then kills and reaps every worker left."""
    children: set[int] = set()
    released: set[int] = set()
    try:
        while True:
            released -= {pid for pid in released if os.waitpid(pid, os.WNOHANG)[0]}
            commands.settimeout(RELEASED_REAP_INTERVAL_S if released else None)
            try:
                packet, fds, _, _ = socket.recv_fds(commands, MAX_PACKET_BYTES, 2)
            except TimeoutError:
                continue
            if not packet:
                return
            command = decode_body(packet)
            if command == ("fork",) and len(fds) == 2 and _thread_count() == 1:
                pid = os.fork()
                if pid == 0:
                    _run_worker(tasks, commands, fds)
                for fd in fds:
                    os.close(fd)
                children.add(pid)
                _reply(commands, ("forked", pid))
            elif isinstance(command, tuple) and len(command) == 3 and command[0] == "reap" and command[1] in children:
                children.discard(command[1])
                _reply(commands, ("reaped", command[1], _reap(command[1], command[2])))
            elif isinstance(command, tuple) and command[:1] == ("release",) and command[1:] and command[1] in children:
                children.discard(command[1])
                released.add(command[1])
            else:
                for fd in fds:
                    os.close(fd)
                why = f"{_thread_count()} threads" if command == ("fork",) else "unknown command or pid"
                _reply(commands, ("refused", f"{command!r:.100}: {why}"))
    finally:
        for pid in children | released:
            _reap(pid, 0.0)


def main() -> None:
    """The zygote: limits, imports the task module named in argv, then forks workers on command (fd 0)."""
    from reward_fns.process_pool.worker import prepare_process

    commands = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    prepare_process(int(sys.argv[1]))
    # Imported before "ready": a module that cannot be imported (missing checker data, a broken
    # install) ends the zygote here, with the traceback on stderr.
    module = importlib.import_module(sys.argv[2])
    warm_up = getattr(module, "warm_up", None)
    if warm_up is not None:
        warm_up()  # what a first check would load lazily is loaded here, once, for every fork
    tasks = module.TASKS
    if _thread_count() != 1:
        names = [Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in os.listdir("/proc/self/task")]
        sys.exit(f"the worker zygote has threads {names} after importing {sys.argv[2]}; it forks only when alone")
    gc.freeze()  # imported objects stay out of the collector: fewer pages copied in each worker
    _reply(commands, ("ready", os.getpid()))
    _serve_commands(tasks, commands)
