"""The image store of the server's node, as the server reports it: the names of its images (GET
/v1/images, versioned in /v1/status, for the client's placement) and its size and share ratio
(/metrics).

Everything is read on a thread and kept, so a route or a scrape never touches the disk. Each
``refresh`` stats index.json and reads the names again only when it changed; the store's usage
(every manifest and blob size) is read again when the index changed or ``usage_every_s`` passed,
since a prune or a pull in flight changes the sizes without the index.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from dataclasses import dataclass

from raas.images.store import ImageStore, StoreUsage

log = logging.getLogger(__name__)

# index.json's (inode, size, mtime): the store replaces the file whenever it writes it.
Stamp = tuple[int, int, int]


@dataclass(frozen=True)
class StoreReading:
    stamp: Stamp | None  # None: the store has no index yet
    names: tuple[str, ...]
    version: str
    usage: StoreUsage
    usage_at: float  # time.monotonic() of the usage reading


class ImageStoreMonitor:
    """What the node's image store holds, read every ``refresh_s`` by ``start``'s task."""

    def __init__(
        self, store: ImageStore, refresh_s: float = 5.0, usage_every_s: float = 60.0
    ) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.usage_every_s = usage_every_s
        self.reading: StoreReading | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def version(self) -> str | None:
        return None if self.reading is None else self.reading.version

    @property
    def names(self) -> tuple[str, ...]:
        return () if self.reading is None else self.reading.names

    @property
    def usage(self) -> StoreUsage | None:
        return None if self.reading is None else self.reading.usage

    async def refresh(self) -> None:
        """Read the store again (on a thread); a store that cannot be read keeps the last
        reading, said once in the log until it can."""
        try:
            self.reading = await asyncio.to_thread(self._read, self.reading)
        except OSError as e:
            if not self._failing:
                log.warning("cannot read the image store %s: %s", self.store.root, e)
            self._failing = True
            return
        self._failing = False

    def _read(self, last: StoreReading | None) -> StoreReading:
        stamp = _stamp(self.store.index_file)
        now = time.monotonic()
        if last is not None and stamp == last.stamp:
            if now - last.usage_at < self.usage_every_s:
                return last
            names, version = last.names, last.version
        else:
            names = tuple(self.store.names())
            version = _version(names)
        return StoreReading(stamp, names, version, self.store.usage(), now)

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_every())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _refresh_every(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()


def _stamp(path: os.PathLike[str]) -> Stamp | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _version(names: tuple[str, ...]) -> str:
    """The same names give the same version on every server and after a restart."""
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
