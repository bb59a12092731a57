"""File locks (fcntl.flock) that several processes sharing one store directory agree on.

A lock file may be removed by whoever holds it exclusively (prune removes an image's lock file
with the image); ``hold`` therefore checks, once it has the lock, that the path still names the
file it locked, and tries again on the new file if not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class Busy(Exception):
    """A non-blocking lock that another process holds."""


@contextlib.contextmanager
def hold(path: Path, *, shared: bool = False, wait: bool = True) -> Iterator[None]:
    """Hold the lock of ``path`` (made if need be); ``Busy`` if taken and not ``wait``."""
    flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, flags)
            except BlockingIOError as e:
                raise Busy(str(path)) from e
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed while we waited: lock the file that is there now
    try:
        yield
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def is_held(path: Path) -> bool:
    """Whether some process holds ``path``'s lock (shared or exclusive) right now."""
    try:
        with hold(path, wait=False):
            return False
    except Busy:
        return True
