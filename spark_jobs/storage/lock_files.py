"""Lock files that someone else may remove: an ``flock`` that counts only while its path
still names the locked file.

A lock held through a file that lost its name (a temp-dir cleaner, or a newer installation
clearing old ones away) excludes no one: the next process creates a new file at that path
and locks that. So a lock is handed out only once the path names the open file, and its
holder asks again (``names``) before it trusts what the lock guarded. Held locks are
touched, so that a cleaner removing files by age keeps the ones in use.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from pathlib import Path
from typing import IO

#: How often a waiting process tries a held lock again.
_POLL_S = 0.05


def acquire(path: Path, mode: int, wait_s: float) -> IO[str] | None:
    """The lock file at ``path`` (made if missing), open and locked in ``mode``
    (``fcntl.LOCK_SH`` or ``LOCK_EX``); None if that took longer than ``wait_s`` (0: one
    try; ``math.inf``: as long as it takes)."""
    deadline = time.monotonic() + wait_s
    # Not blocking: a FIFO planted at the path would hold the open forever.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    while True:
        handle = open(os.open(path, flags, 0o600), "w")  # noqa: SIM115 - returned or closed
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            handle.close()
            raise OSError(f"{path} is not a regular file, so it cannot serve as a lock file")
        if _flock(handle, mode, deadline) and names(path, handle):
            os.utime(handle.fileno())
            return handle
        handle.close()
        if time.monotonic() >= deadline:
            return None


def names(path: Path, handle: IO[str]) -> bool:
    """Whether ``path`` is still the name of the open file ``handle``."""
    try:
        found = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino)


def _flock(handle: IO[str], mode: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
