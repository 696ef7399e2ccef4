"""An exclusive lock on a path, for outputs that two processes could write at once (a shared cache
of tiny assets, an export folder): the second one waits, or is refused, never both "succeed".

``flock`` on a lock file that is removed on release. Removing a lock file is racy unless the
holder checks, once locked, that the path still names the file it locked (another process may
have removed it and created a new one in between); that check is the loop below.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from primus.config.errors import ConfigError


class Busy(ConfigError):
    """Another process holds the lock (and we were told not to wait, or waited long enough)."""


def _still_names(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


@contextmanager
def exclusive(lock_path: str | Path, *, what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold ``lock_path`` for the block: wait up to ``wait_s`` seconds for another holder, then
    ``Busy`` (one line naming ``what`` and the holder's pid)."""
    lock_path = Path(lock_path)
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                        raise Busy(f"{what}: {holder} is writing it right now (lock {lock_path}); "
                                   "wait for it to finish, or choose another path") from None
                    time.sleep(0.1)
        except BaseException:
            os.close(fd)
            raise
        if _still_names(fd, lock_path):
            break
        os.close(fd)  # the holder before us removed the file we locked: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        try:
            os.unlink(lock_path)
        except FileNotFoundError:
            pass
        os.close(fd)  # closing releases the flock, after the file is gone
