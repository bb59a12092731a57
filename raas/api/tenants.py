"""Who is asking (the admin or a tenant), what of the jobs they see, and the tenants file kept
fresh without a restart.

The auth middleware (raas.api.auth) puts the request's ``Caller`` into its scope; routes take it
with ``Depends(caller)``. A tenant's job ids are its own namespace: its ids become keys with
``Caller.key`` and keys its ids with ``Caller.show``, so a key of another tenant's job can be
neither named nor shown, and another tenant's job answers as one that does not exist (404). A
route that changes the whole server, which every tenant shares (the backend pool, whether jobs
are accepted), lets only the admin on (``ADMIN_ONLY``: a tenant gets a 403).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from raas.settings import ServeSettings
from raas.tenants import (
    DEFAULT_TENANT,
    Tenants,
    TenantsFileError,
    job_key,
    load_tenants,
    own_id,
)

log = logging.getLogger(__name__)
SCOPE_KEY = "raas.caller"
CHECK_S = 2.0  # how often the tenants file's mtime is looked at


@dataclass(frozen=True)
class Caller:
    """The admin (``tenant`` None: every job, ids as the server keys them) or one tenant."""

    tenant: str | None = None

    @property
    def submits_as(self) -> str:
        """The tenant of the jobs this caller submits (the admin's own: the default)."""
        return self.tenant if self.tenant is not None else DEFAULT_TENANT

    def key(self, job_id: str) -> str:
        """The key of the job this caller names ``job_id`` (the admin names keys)."""
        return job_id if self.tenant is None else job_key(self.tenant, job_id)

    def show(self, key: str) -> str:
        """The id this caller knows the job of ``key`` by."""
        return key if self.tenant is None else own_id(key)


ADMIN = Caller()
# Let in without a key (an open path, a job token on the gateway's): a tenant of no job, so
# that a route that asked would find nothing.
NOBODY = Caller("")


async def caller(request: Request) -> Caller:
    """The request's caller, as the auth middleware found it (no key set: the admin)."""
    found = request.scope.get(SCOPE_KEY, ADMIN)
    assert isinstance(found, Caller)
    return found


NOT_ADMIN = (
    "this route acts on the whole server, which every tenant shares: it needs the admin's key"
    " (the server's API key), not a tenant's"
)


async def admin(who: Annotated[Caller, Depends(caller)]) -> None:
    """Refuse a tenant (a 403): one tenant must not pause, drain or empty what all share. The
    admin, and every caller of a server without a tenants file, goes on."""
    if who.tenant is not None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=NOT_ADMIN)


ADMIN_ONLY = [Depends(admin)]  # a route's ``dependencies=``


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def watch_tenants(settings: ServeSettings) -> TenantsWatch | None:
    """The server's tenants file, read now (None: it has none): one that cannot be used, or one
    without the admin's key (without a key nobody is told apart), stops the server before it
    starts, in one line."""
    path = settings.auth.tenants_file
    if path is None:
        return None
    if settings.auth.api_key is None:
        raise TenantsFileError(
            f"tenants file {path}: needs an API key, the admin's (RAAS_API_KEY or"
            " --api-key-file): without one every caller is the admin"
        )
    return TenantsWatch(path)


class TenantsWatch:
    """The tenants of ``path`` as last read well: read again when the file changes (its mtime,
    size or inode, looked at every CHECK_S off the event loop) or on SIGHUP. A file that cannot
    be used keeps the tenants read before, and says why in one line. ``on_change`` is told each
    new reading, on the event loop (the server hands the weights and quotas to the pipeline)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp(path)
        self.current = load_tenants(path)  # at start, a bad file is an error (TenantsFileError)
        self.on_change: Callable[[Tenants], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._hup = False
        self._hups: set[asyncio.Task[bool]] = set()  # SIGHUP's readings, held till done

    def reload(self) -> bool:
        """Read the file again (blocking: on a thread); whether the tenants were replaced."""
        self._stamp = _stamp(self.path)
        try:
            tenants = load_tenants(self.path)
        except TenantsFileError as e:
            log.error("%s; the tenants read before stay", e)
            return False
        self.current = tenants
        log.info("tenants file %s read again: %d tenants", self.path, len(tenants))
        return True

    async def check(self) -> bool:
        """Read the file again if it changed; whether the tenants were replaced."""
        if await asyncio.to_thread(_stamp, self.path) == self._stamp:
            return False
        return await self.reload_async()

    async def reload_async(self) -> bool:
        """``reload`` off the event loop, then ``on_change`` told of a new reading on it."""
        replaced = await asyncio.to_thread(self.reload)
        if replaced and self.on_change is not None:
            self.on_change(self.current)
        return replaced

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="raas-tenants-watch")
        # Only the main thread may take a signal (a test's app runs elsewhere, on no signal).
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_hup)
            self._hup = True

    def _on_hup(self) -> None:
        task = asyncio.create_task(self.reload_async())
        self._hups.add(task)
        task.add_done_callback(self._hups.discard)

    async def stop(self) -> None:
        if self._hup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self.check()
            except Exception:  # the watch must outlive one bad reading
                log.exception("tenants file %s: could not be checked", self.path)
