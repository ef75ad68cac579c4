"""One writer per store: an OS lock on a file beside the store, with a timeout and the holder's name.

Every persistent store (the embedded engine's directory, an ``InMemoryStore`` ``.pgr`` file, an
ingest's ledger) takes :class:`StoreLock` around its writes. The lock is ``fcntl.flock`` on
``<target>.lock`` (``<dir>/.lock`` for a directory): the kernel drops it when the holder dies, even on
``kill -9``, so a crashed writer never leaves a stale lock. The holder writes its pid, host and what
it is doing into the file; a second writer waits up to ``timeout_s`` and then raises
:class:`StoreLockedError` naming that holder.

>>> with StoreLock("/tmp/pgr-doctest.pgr", what="save"):  # doctest: +SKIP
...     ...
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType

from pgr_core.errors import ConfigurationError

try:  # POSIX; on other systems the lock is process-local only (documented)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["StoreLock", "StoreLockedError", "lock_path_for"]

_REGISTRY_LOCK = threading.Lock()


class _Entry:
    """One lock file's state in this process: flock is per open file, so every StoreLock on one path
    shares a single descriptor. The thread that took it re-enters freely, another thread of the process
    waits; any thread may release it (a store is closed by whichever thread drops it last)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.owner: int | None = None  # the thread that took it
        self.fd: int | None = None
        self.depth = 0

    def enter(self, timeout_s: float | None) -> bool:
        """Take the in-process part (re-entrantly for its owner); False after ``timeout_s``."""
        me = threading.get_ident()
        with self.cond:
            if not self.cond.wait_for(lambda: self.depth == 0 or self.owner == me, timeout_s):
                return False
            self.owner = me
            self.depth += 1
            return True

    def leave(self) -> bool:
        """Undo one :meth:`enter`; True when that was the last, so the file lock goes too."""
        with self.cond:
            self.depth -= 1
            if self.depth:
                return False
            self.owner = None
            self.cond.notify_all()
            return True


_REGISTRY: dict[str, _Entry] = {}


class StoreLockedError(ConfigurationError):
    """Another process holds the store's lock past the timeout; ``holder`` is what it wrote."""

    def __init__(self, message: str, holder: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.holder = holder or {}


def lock_path_for(target: str | Path) -> Path:
    target = Path(target)
    if target.is_dir():
        return target / ".lock"
    return target.with_name(target.name + ".lock")


def read_holder(path: str | Path) -> dict[str, object]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class StoreLock:
    """An exclusive, re-entrant (within one process) lock on ``target``.

    ``timeout_s``: how long a second writer waits (0: refuse at once; None: wait forever).
    """

    def __init__(self, target: str | Path, *, timeout_s: float | None = 30.0, what: str = "write") -> None:
        if timeout_s is not None and (isinstance(timeout_s, bool) or not timeout_s >= 0):
            raise ConfigurationError(f"lock timeout_s must be None or a number >= 0, got {timeout_s!r}")
        self.path = lock_path_for(target)
        self.target = Path(target)
        self.timeout_s = timeout_s
        self.what = what
        self._held = 0
        with _REGISTRY_LOCK:  # one entry per lock file in this process, whatever path names it
            self._shared = _REGISTRY.setdefault(str(self.path.resolve()), _Entry())

    def _refuse(self) -> StoreLockedError:
        holder = read_holder(self.path)
        who = (
            f"process {holder.get('pid')} on {holder.get('host')} ({holder.get('what')}, since {holder.get('since')})"
            if holder
            else "another process"
        )
        return StoreLockedError(
            f"{self.target} is locked by {who}; waited {self.timeout_s:g} s. One process writes an embedded "
            "store at a time: wait for it to finish, or share one memory between processes through a Qdrant "
            "server (QdrantStore)",
            holder,
        )

    def acquire(self) -> StoreLock:
        entry = self._shared
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        if not entry.enter(self.timeout_s):
            raise self._refuse()
        try:
            if entry.fd is None:
                entry.fd = self._lock_file(deadline)
        except BaseException:
            entry.leave()
            raise
        self._held += 1
        return self

    def _lock_file(self, deadline: float | None) -> int:
        """The OS lock on the lock file, waiting until ``deadline``; writes who holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except (IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            raise ConfigurationError(
                f"cannot use {self.path} as the lock file of {self.target} ({exc.strerror}); "
                "remove or rename what is there and open the store again"
            ) from None
        try:
            while fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                    if deadline is not None and time.monotonic() >= deadline:
                        raise self._refuse() from None
                    time.sleep(0.05)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "what": self.what,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self) -> None:
        """Undo one :meth:`acquire` of this object; from any thread (a store closed by the collector)."""
        if not self._held:
            return
        self._held -= 1
        entry = self._shared
        with entry.cond:  # the descriptor is closed before another thread may take the entry
            if entry.depth == 1 and entry.fd is not None:
                fd, entry.fd = entry.fd, None
                try:
                    os.ftruncate(fd, 0)
                except OSError:
                    pass
                os.close(fd)  # closing drops the flock
            entry.leave()

    @property
    def held(self) -> bool:
        return self._held > 0

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
