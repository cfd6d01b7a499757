"""A pool of reusable worker processes with a memory limit and a parent-enforced deadline.

The rules in full: ``docs/reward_fns.md`` (``reward_fns/process_pool/pool.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import threading
import time
from typing import IO, Any

from reward_fns.process_pool.protocol import HEADER, MAX_FRAME_BYTES, decode_body, encode_frame
from reward_fns.process_pool.zygote import PendingFork, Zygote, ZygoteError
from reward_fns.total import ResponseTimeout, VerifierFaultError


def default_workers() -> int:
    """``min(32, os.cpu_count() + 4)``: as many workers as verl's reward loop runs calls at once.

    verl's reward managers run each synchronous ``compute_score`` in the event loop's default
    ``ThreadPoolExecutor``, whose size Python sets to this very formula.
    """
    return min(32, (os.cpu_count() or 1) + 4)


DEFAULT_WORKERS = default_workers()
# Address space per worker: Python with sqlite3 and sqlglot, and the instruction-following checkers' libraries
# (nltk, langdetect, ...), mapped before any check runs, plus room for the check itself.
DEFAULT_MEMORY_LIMIT_BYTES = 1024**3
# Below this a worker cannot even import its libraries.
MIN_MEMORY_LIMIT_BYTES = 256 * 1024**2
# The longest deadline accepted (one day); select.poll cannot wait much longer than 2**31 ms.
MAX_TIMEOUT_S = 86_400.0
# A worker that cannot start is retried this many times in a row before the pool gives up.
START_ATTEMPTS = 3
# Workers that die on their own (not killed at a deadline) this many times in a row, with no
# answer in between, mean a broken machine or install, not a hostile response.
MAX_DEATHS_IN_A_ROW = 8
# How long past its deadline the parent waits before killing a worker: the in-worker
# timer or SQLite's progress handler normally answers first, with a clearer message.
KILL_GRACE_S = 0.2
# A deadline shorter than KILL_GRACE_S / KILL_GRACE_FRACTION gets this fraction of itself as
# its grace: a kill costs only a fork, and a tight deadline is kept tight.
KILL_GRACE_FRACTION = 0.25
# The worker's own timer fires this fraction of the grace after the deadline: a task's own
# deadline (SQLite's progress handler) answers first, and the timer before the kill.
IN_WORKER_TIMER_FRACTION = 0.25
# A worker that is not ready this long after its start is considered broken.
STARTUP_TIMEOUT_S = 60.0
_CLOSE_WAIT_S = 2.0
_READ_CHUNK_BYTES = 1 << 16


def kill_grace(timeout_s: float) -> float:
    """Seconds past a task's deadline before its worker is killed.

    ``min(KILL_GRACE_S, KILL_GRACE_FRACTION * timeout_s)``: 0.2 s from a 0.8 s deadline up.
    """
    return min(KILL_GRACE_S, KILL_GRACE_FRACTION * timeout_s)


class WorkerFailure(Exception):
    """A task got no answer: its worker overran the deadline and was killed, or died, or the task raised."""


class DeadlineExceeded(WorkerFailure, ResponseTimeout):
    """The worker did not answer within the task's deadline and was killed (the response's doing)."""


class _Broken(Exception):
    """A worker can no longer be used; `kind` is "deadline", "died" or "protocol" (see the message)."""

    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(message or kind)
        self.kind = kind


class WorkerStartError(VerifierFaultError):
    """No worker process could start in `START_ATTEMPTS` tries (a broken install, missing checker data,
    a memory limit too small for the family's libraries).

    Not a `WorkerFailure`: no response is to blame, so the reward raises it (the run stops with
    this message) instead of quietly scoring every response 0.
    """


class PoolBrokenError(VerifierFaultError):
    """`MAX_DEATHS_IN_A_ROW` workers died on their own with no answer in between."""


def _signal_name(returncode: int | None) -> str:
    if returncode is None or returncode >= 0:
        return f"exit status {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class _Worker:
    """One worker process, forked by the pool's zygote, with its two pipes and a pidfd.

    A worker whose fork failed (the zygote could not start or answer) holds the reason in `failure`
    and has no process: `poll_ready` raises it, so the pool's start retries count it. With
    ``wait=False`` the fork command is only sent (`Zygote.fork_soon`): the pid and pidfd are learnt
    when first needed (`alive`, `kill`), and a fork the zygote could not take at once leaves
    `failure` set.
    """

    def __init__(self, zygote: Zygote, wait: bool = True) -> None:
        self.zygote = zygote
        self.ready = False
        self.started_at = time.monotonic()
        self.failure: str | None = None
        self.pid: int | None = None
        self._pidfd: int | None = None
        self._pending_fork: PendingFork | None = None
        self.forked_soon = not wait
        self._ended: str | None = None
        self._end_lock = threading.RLock()
        self._pending = bytearray()
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        try:
            if wait:
                self.pid = zygote.fork(requests_read, replies_write, STARTUP_TIMEOUT_S)
                self._open_pidfd(self.pid, requests_write, replies_read)
            else:
                self._pending_fork = zygote.fork_soon(requests_read, replies_write)
                if self._pending_fork is None:
                    self.failure = "the zygote could not take a fork command at once"
        except ZygoteError as error:
            self.failure = f"{error}; the zygote: {zygote.returncode_text()}"
        finally:
            os.close(requests_read)
            os.close(replies_write)
        os.set_blocking(requests_write, False)  # a request is written under its deadline (`_write_all`)
        self.requests: IO[bytes] = os.fdopen(requests_write, "wb", buffering=0)
        self.replies: IO[bytes] = os.fdopen(replies_read, "rb", buffering=0)

    def _open_pidfd(self, pid: int, requests_write: int, replies_read: int) -> None:
        try:
            # Race-free: the zygote reaps a worker only when asked, so the pid is still this worker's.
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # out of file descriptors: the worker goes, and so do our pipe ends
            with contextlib.suppress(ZygoteError):
                self.zygote.reap(pid, 0.0)
            os.close(requests_write)
            os.close(replies_read)
            raise

    def _resolve(self) -> None:
        """Learns the pid of a worker forked with ``wait=False`` and opens its pidfd (once; a failure is kept)."""
        with self._end_lock:
            pending, self._pending_fork = self._pending_fork, None
            if pending is None:
                return
            try:
                self.pid = self.zygote.collect(pending)
            except ZygoteError as error:
                self.failure = f"{error}; the zygote: {self.zygote.returncode_text()}"
                return
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError as error:  # out of file descriptors: the worker goes
                with contextlib.suppress(ZygoteError):
                    self.zygote.reap(self.pid, 0.0)
                self.failure, self.pid = f"its pidfd could not be opened ({error})", None

    def alive(self) -> bool:
        """Whether the worker process still runs (a pidfd becomes readable when its process exits)."""
        self._resolve()
        return self._pidfd is not None and not _fd_readable(self._pidfd, 0.0)

    def poll_ready(self, timeout_s: float) -> bool:
        """Waits up to `timeout_s` for the worker's "ready" frame; True once it came.

        Raises:
            _Broken: If the fork failed, the worker died or sent something else.
        """
        if self.ready:
            return True
        if self.failure is not None:
            raise _Broken("died", self.failure)
        if not _readable(self.replies, timeout_s):
            return False
        message = self._read_frame(time.monotonic() + STARTUP_TIMEOUT_S)
        if not (isinstance(message, tuple) and message[:1] == ("ready",)):
            raise _Broken("protocol", f"it sent {message!r:.200} instead of its ready signal")
        self.ready = True
        return True

    def call(self, request: bytes, deadline: float) -> Any:
        """Sends one framed request and returns the reply's message.

        Raises:
            _Broken: If the deadline passes, the worker dies first or its reply is unreadable.
        """
        self._write_all(request, deadline)
        reply = self._read_frame(deadline)
        if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] in ("ok", "error", "timeout")):
            raise _Broken("protocol", f"it sent {reply!r:.200} instead of a reply")
        return reply

    def _write_all(self, data: bytes, deadline: float) -> None:
        """Writes a request into the (non-blocking) pipe as the worker reads it, giving up at the deadline."""
        view, written = memoryview(data), 0
        while written < len(view):
            try:
                written += os.write(self.requests.fileno(), view[written:])
            except BlockingIOError:
                if not _fd_writable(self.requests.fileno(), deadline - time.monotonic()):
                    raise _Broken("deadline") from None
            except OSError as error:  # BrokenPipeError: it died
                raise _Broken("died", f"it could not take the query ({error})") from error

    def _read_frame(self, deadline: float) -> Any:
        header = self._read_exactly(HEADER.size, deadline)
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise _Broken("protocol", f"it sent a reply of {size} bytes (at most {MAX_FRAME_BYTES})")
        body = self._read_exactly(size, deadline)
        try:
            return decode_body(body)
        except Exception as error:  # anything a subverted worker might send
            raise _Broken("protocol", f"it sent an unreadable reply ({type(error).__name__}: {error})") from None

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        # Reads ahead (a header and a small body usually come in one read), keeping the rest for next time.
        while len(self._pending) < size:
            if not _readable(self.replies, deadline - time.monotonic()):
                raise _Broken("deadline")
            chunk = os.read(self.replies.fileno(), max(size - len(self._pending), _READ_CHUNK_BYTES))
            if not chunk:
                raise _Broken("died")
            self._pending += chunk
        data = bytes(self._pending[:size])
        del self._pending[:size]
        return data

    def kill(self, status_wanted: bool = True) -> str:
        """Kills the worker at once (through its pidfd), closes its pipes and returns how it ended.

        With `status_wanted` the zygote reaps it now and its status is returned (a worker that died
        on its own: its signal); otherwise the zygote reaps it in the background and "SIGKILL" is
        returned at once. Idempotent.
        """
        with self._end_lock:
            self._resolve()
            if self._ended is None:
                if self._pidfd is not None:
                    with contextlib.suppress(ProcessLookupError):  # it has exited already
                        signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                if status_wanted or self.pid is None:
                    self._ended = self._reaped(0.0)
                else:
                    with contextlib.suppress(ZygoteError):  # a dead zygote's orphans are reaped by init
                        self.zygote.release(self.pid)
                    self._ended = "SIGKILL"
            self.forget()
            return self._ended

    def close_input(self) -> None:
        """Closes the request pipe: the worker exits once its current task ends."""
        with contextlib.suppress(OSError):
            self.requests.close()

    def stop(self, wait_s: float) -> None:
        """Asks the worker to exit by closing its input; the zygote kills it if it has not exited in time."""
        self.close_input()
        with self._end_lock:
            self._resolve()
            if self._ended is None:
                self._ended = self._reaped(wait_s)
            self.forget()

    def _reaped(self, wait_s: float) -> str:
        if self.pid is None:
            return self.failure or "never started"
        try:
            return _signal_name(self.zygote.reap(self.pid, wait_s))
        except ZygoteError as error:  # the zygote is gone: the worker's exit is its new parent's to reap
            if self._pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            return f"SIGKILL, unreaped: {error}"

    def forget(self) -> None:
        """Closes this process's ends of the pipes and the pidfd (after a fork: the child's copies only)."""
        for stream in (self.requests, self.replies):
            with contextlib.suppress(OSError):
                stream.close()
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None


def _readable(stream: IO[bytes], timeout_s: float) -> bool:
    """Whether the stream has data (or end of file) within `timeout_s` seconds."""
    return _fd_readable(stream.fileno(), timeout_s)


def _fd_writable(fd: int, timeout_s: float) -> bool:
    """Whether a pipe can take more data (or its reader is gone) within `timeout_s` seconds."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT | select.POLLERR)
    return bool(poller.poll(max(timeout_s, 0.0) * 1000.0))


def _fd_readable(fd: int, timeout_s: float) -> bool:
    """Whether a file descriptor is readable (data, end of file, an exited pidfd) within `timeout_s` seconds."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(max(timeout_s, 0.0) * 1000.0))


class WorkerPool:
    """Up to `size` worker processes running one task module's ``TASKS``, started on demand and reused.

    Args:
        tasks_module: The module the workers import (its ``TASKS`` dict names the tasks).
        size: Most worker processes (also the number of calls that can run at once).
        memory_limit_bytes: Address-space limit of each worker (``RLIMIT_AS``).
        label: What the workers check ("SQL", "instruction-following"), for messages.
        timer_in_worker: Whether a worker stops a task at its deadline with its own timer (see
            `worker`); off for tasks that stop themselves with a clearer message (SQLite's progress
            handler), which the timer would otherwise interrupt.

    Raises:
        ValueError: If `size` < 1 or the memory limit is below 256 MiB (a worker could not even import).
    """

    def __init__(
        self,
        tasks_module: str,
        size: int = DEFAULT_WORKERS,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
        label: str = "reward",
        timer_in_worker: bool = True,
    ) -> None:
        if size < 1:
            raise ValueError(f"a {label} worker pool needs at least 1 worker; got size={size}")
        if memory_limit_bytes < MIN_MEMORY_LIMIT_BYTES:
            raise ValueError(f"{label} worker memory limit {memory_limit_bytes} bytes is below the 256 MiB minimum")
        self.tasks_module = tasks_module
        self.label = label
        self.timer_in_worker = timer_in_worker
        self.size = size
        self.memory_limit_bytes = memory_limit_bytes
        self.owner_pid = os.getpid()
        self.kills = 0
        self._deaths_in_a_row = 0
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._condition = threading.Condition()
        self._closed = False
        self._forking = 0  # workers being forked now, outside the lock
        self._forks_owed = 0  # replacements the zygote was too busy to take at once (`_fork_soon`)
        self._zygote: Zygote | None = None
        self._zygote_lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return self._closed

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (idle and busy)."""
        with self._condition:
            return [worker.pid for worker in (*self._idle, *self._busy) if worker.pid is not None]

    def running_pids(self) -> list[int]:
        """Process ids of the workers that are ready and running a task now."""
        with self._condition:
            return [worker.pid for worker in self._busy if worker.ready and worker.pid is not None]

    def zygote_pid(self) -> int | None:
        """Process id of the zygote that forks this pool's workers (None before the first call)."""
        with self._condition:
            return None if self._zygote is None else self._zygote.pid

    def call(self, task_name: str, kwargs: dict[str, Any], timeout_s: float) -> Any:
        """Runs one task in a worker and returns its result.

        Args:
            task_name: A name in the task module's ``TASKS``.
            kwargs: The task's arguments (plain data).
            timeout_s: The task's deadline; the worker is killed `kill_grace(timeout_s)` after it.

        Returns:
            The task's return value.

        Raises:
            WorkerFailure: If the worker overran the deadline, died, or the task raised
                (the message says which); the pool stays usable.
            WorkerStartError: If no worker could start (see the class).
            PoolBrokenError: If workers keep dying on their own (see the class).
        """
        # The worker stops the task itself just past the deadline and stays warm; the kill below is
        # the backstop for a task stuck where its timer cannot reach it (one long C call).
        timeout_s = float(timeout_s)  # plain data in the request (a numpy scalar would not decode in the worker)
        grace = kill_grace(timeout_s)
        in_worker_deadline = timeout_s + IN_WORKER_TIMER_FRACTION * grace if self.timer_in_worker else None
        request = encode_frame((task_name, kwargs, in_worker_deadline))
        worker = self._acquire()
        deadline = time.monotonic() + timeout_s + grace
        try:
            status, value = worker.call(request, deadline)
        except _Broken as broken:
            # A worker killed at its deadline ended by our SIGKILL: no need to wait for its status.
            how = self._replace(worker, status_wanted=broken.kind != "deadline")
            if broken.kind == "deadline":
                raise DeadlineExceeded(
                    f"the {self.label} worker did not answer within the {timeout_s:g} s deadline and was killed"
                ) from None
            if broken.kind == "died":
                self._count_death(how)
                raise WorkerFailure(f"the {self.label} worker process died while checking ({how})") from None
            raise WorkerFailure(f"the {self.label} worker was killed: {broken}") from None
        except BaseException:
            self._replace(worker)  # e.g. KeyboardInterrupt mid-call: the pipe is out of step
            raise
        with self._condition:
            self._deaths_in_a_row = 0
        self._release(worker)
        if status == "timeout":
            raise DeadlineExceeded(
                f"the {self.label} worker did not finish within the {timeout_s:g} s deadline and stopped the check"
            )
        if status != "ok":
            raise WorkerFailure(str(value))
        return value

    def _count_death(self, how: str) -> None:
        with self._condition:
            self._deaths_in_a_row += 1
            deaths = self._deaths_in_a_row
        if deaths >= MAX_DEATHS_IN_A_ROW:
            raise PoolBrokenError(
                f"{deaths} {self.label} worker processes in a row died on their own ({how}, the last) "
                "without answering: the machine or the install is broken, not a response; see their "
                "standard error"
            )

    def _acquire(self) -> _Worker:
        """Takes a live, ready worker, preferring one that is ready now; starts workers up to `size`.

        A worker found dead while idle (killed from outside) is replaced and another one taken,
        so no response is blamed for it. A worker that fails to start is replaced up to
        `START_ATTEMPTS` times in a row.

        Raises:
            WorkerStartError: If `START_ATTEMPTS` fresh workers in a row exit or are not ready in time.
        """
        failed_starts = 0
        while True:
            worker = self._take_idle()
            try:
                if not worker.poll_ready(max(STARTUP_TIMEOUT_S - (time.monotonic() - worker.started_at), 0.0)):
                    raise _Broken("deadline", f"it was not ready within {STARTUP_TIMEOUT_S:g} s")
            except _Broken as broken:
                how = self._replace(worker)
                failed_starts += 1
                if failed_starts < START_ATTEMPTS:
                    continue
                reason = "it exited" if broken.kind == "died" else str(broken)
                raise WorkerStartError(
                    f"no {self.label} worker process could start in {START_ATTEMPTS} attempts "
                    f"(python -c ... {self.tasks_module}): {reason} ({how}); its standard error above says why"
                ) from None
            if worker.alive():
                return worker
            self._replace(worker)

    def _take_idle(self) -> _Worker:
        """Moves an idle worker to the busy set, or forks one (below `size`), or waits for one.

        The fork happens outside the pool's lock, so other calls keep taking and returning workers.
        """
        with self._condition:
            while True:
                if self._closed:
                    raise WorkerFailure(f"the {self.label} worker pool is closed")
                if self._idle:
                    worker = self._take_ready_or_oldest()
                    self._busy.add(worker)
                    return worker
                if self._workers_counted() < self.size:
                    self._forking += 1
                    break
                self._condition.wait()
        return self._forked()

    def _forked(self) -> _Worker:
        """Forks a worker for a slot counted in `_forking` and puts it in the busy set."""
        try:
            worker = self._fork_worker()
        except BaseException:
            with self._condition:
                self._forking -= 1
                self._condition.notify()
            raise
        with self._condition:
            self._forking -= 1
            closed = self._closed
            if not closed:
                self._busy.add(worker)
        if closed:
            worker.kill()
            raise WorkerFailure(f"the {self.label} worker pool is closed")
        self._pay_owed_fork()  # the zygote has just answered this fork: it is free for one more
        return worker

    def _take_ready_or_oldest(self) -> _Worker:
        """The most recently used ready worker (its caches are warm), else the oldest."""
        for index in range(len(self._idle) - 1, -1, -1):
            try:
                if self._idle[index].poll_ready(0.0):
                    return self._idle.pop(index)
            except _Broken:
                continue  # it died while idle; the caller finds out and replaces it
        return self._idle.pop(0)

    def _release(self, worker: _Worker) -> None:
        with self._condition:
            self._busy.discard(worker)
            if self._closed:
                worker.stop(0.0)
            else:
                self._idle.append(worker)
            self._condition.notify()
        self._pay_owed_fork()

    def _fork_worker(self) -> _Worker:
        """A worker forked by the zygote (started first, or again after it broke or died).

        Raises:
            WorkerFailure: If the pool is closed.
        """
        with self._zygote_lock:
            if self._closed:
                raise WorkerFailure(f"the {self.label} worker pool is closed")
            if self._zygote is None or not self._zygote.usable():
                if self._zygote is not None:
                    self._zygote.close(0.0)
                self._zygote = Zygote(self.memory_limit_bytes, self.tasks_module)
            zygote = self._zygote
        return _Worker(zygote)  # the first fork waits for the zygote's imports

    def _replace(self, worker: _Worker, status_wanted: bool = True) -> str:
        """Kills a broken worker; returns how it ended ("SIGKILL" unless `status_wanted`: the zygote
        then reaps it in the background).

        A worker killed at its deadline (``status_wanted=False``) has its replacement's fork command
        sent to the zygote at once, without waiting for the answer (`_fork_soon`): the call that
        failed at its deadline returns at once, and the next call finds a forked worker instead of
        forking one first. Otherwise the next call that needs a worker forks one.
        """
        how = worker.kill(status_wanted)
        with self._condition:
            self._busy.discard(worker)
            self.kills += 1
            fork_now = not status_wanted and not self._closed and self._workers_counted() < self.size
            if fork_now:
                self._forking += 1
            self._condition.notify()
        if fork_now:
            self._fork_soon()
        self._pay_owed_fork()
        return how

    def _workers_counted(self) -> int:
        """Idle, busy and being-forked workers (under the condition's lock)."""
        return len(self._idle) + len(self._busy) + self._forking

    def _fork_soon(self) -> None:
        """Sends a fork to the zygote for a slot counted in `_forking`, without waiting for its answer.

        The worker joins the idle list at its oldest end, after the workers forked this way before it
        (taken once no ready worker is idle; its ready frame and pid are read when a call takes it).
        A zygote busy with another command leaves the fork owed: the next call that returns a worker
        (`_pay_owed_fork`) sends it. A zygote that is not running or not ready is left alone: the
        next call forks as usual.
        """
        worker: _Worker | None = None
        owed = False
        try:
            with self._zygote_lock:
                zygote = self._zygote
            if zygote is not None and zygote.usable() and zygote.ready:
                worker = _Worker(zygote, wait=False)
                if worker.failure is not None:
                    worker.forget()
                    worker, owed = None, zygote.usable()
        finally:
            with self._condition:
                self._forking -= 1
                self._forks_owed += owed
                closed = self._closed
                if worker is not None and not closed:
                    # After the forks sent before it, so the first sent (the first the zygote forks) is taken first.
                    sent_before = next(
                        (i for i, idle in enumerate(self._idle) if idle.ready or not idle.forked_soon), len(self._idle)
                    )
                    self._idle.insert(sent_before, worker)
                self._condition.notify()
        if worker is not None and closed:
            worker.kill()

    def _pay_owed_fork(self) -> None:
        """Sends one owed fork (see `_fork_soon`) if the pool still has room for it."""
        with self._condition:
            if not self._forks_owed:
                return
            if self._closed or self._workers_counted() >= self.size:
                self._forks_owed = 0
                return
            self._forks_owed -= 1
            self._forking += 1
        self._fork_soon()

    def close(self, wait_s: float = _CLOSE_WAIT_S) -> None:
        """Stops every worker (closes its input, kills it after `wait_s`), reaps it, then ends the zygote.

        Idempotent.
        """
        with self._condition:
            self._closed = True
            workers, self._idle = self._idle, []
            busy = list(self._busy)
            self._condition.notify_all()
        with self._zygote_lock:
            zygote, self._zygote = self._zygote, None
        for worker in workers:
            worker.close_input()
        for worker in workers:
            worker.stop(wait_s)
        for worker in busy:  # their callers get "died" and do not restart them
            worker.kill()
        if zygote is not None:
            zygote.close(wait_s)

    def forget_after_fork(self) -> None:
        """In a forked child: closes the child's copies of the pipes and socket, leaving the parent's workers alone."""
        self._closed = True
        for worker in (*self._idle, *self._busy):
            worker.forget()
        if self._zygote is not None:
            self._zygote.forget()
        self._idle, self._busy, self._zygote = [], set(), None
        self._zygote_lock = threading.Lock()  # another thread may have held it at the fork


_shared: dict[str, WorkerPool] = {}
_shared_lock = threading.Lock()


def shared_pool(
    tasks_module: str,
    size: int = DEFAULT_WORKERS,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    label: str = "reward",
    timer_in_worker: bool = True,
) -> WorkerPool:
    """This process's pool for `tasks_module`, made on first use; a call with other settings replaces it.

    Args:
        tasks_module: The module the workers import (one pool per module).
        size: Number of workers.
        memory_limit_bytes: Address-space limit of each worker.
        label: What the workers check, for messages.
        timer_in_worker: See `WorkerPool`.

    Returns:
        The pool.
    """
    with _shared_lock:
        pool = _shared.get(tasks_module)
        if pool is not None and not pool.closed and pool.owner_pid == os.getpid():
            if (pool.size, pool.memory_limit_bytes) == (size, memory_limit_bytes):
                return pool
            pool.close()
        _shared[tasks_module] = pool = WorkerPool(tasks_module, size, memory_limit_bytes, label, timer_in_worker)
        return pool


def close_shared_pool(tasks_module: str | None = None) -> None:
    """Closes this process's pool for `tasks_module`, or every pool (registered with atexit; safe to repeat)."""
    with _shared_lock:
        names = list(_shared) if tasks_module is None else [tasks_module]
        pools = [pool for name in names if (pool := _shared.pop(name, None)) is not None]
    for pool in pools:
        if pool.owner_pid == os.getpid():
            pool.close()


def _forget_shared_pool_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()  # another thread may have held it at the fork
    for pool in _shared.values():
        pool.forget_after_fork()
    _shared.clear()


atexit.register(close_shared_pool)
os.register_at_fork(after_in_child=_forget_shared_pool_in_child)
