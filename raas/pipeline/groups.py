"""Groups of jobs that share one INIT: the n rollouts of one task (``JobRequest.group``).

The jobs in flight that name the same group and the same instance form one group. The first of
them to reach INIT runs the handler's ``init`` for the group (the template), and every member,
that one included, gets a context forked from it (``fork_context``: its sandbox as it was
after ``init``; the template's sandbox is sealed first, so that its forks are copy-on-write
and nothing of it can change what a member sees: ``Sandbox.seal``). Each member stays a job of
its own: an attempt that fails is forked again from the template, not the whole group. The
template lives until the group's last member is finished, then is cleaned up as a context of
its own. A handler without ``fork_context`` runs ``init`` for every job, as without a group.
After a restart the revived jobs regroup by their requests and make a new template.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raas.tasks.protocol import TaskContext, TaskHandler, TaskJob, context_forker


@dataclass(eq=False)
class Group:
    key: tuple[str, str, str]
    handler: TaskHandler
    members: int = 0
    template: TaskContext | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


# Hands a template that no job needs any more to be cleaned up (in the background).
Release = Callable[[TaskHandler, TaskContext], None]


class Groups:
    """The groups with members in flight, by (group, task, instance)."""

    def __init__(self, release: Release) -> None:
        self._by_key: dict[tuple[str, str, str], Group] = {}
        self._release = release

    def join(
        self, name: str | None, task: str, instance: dict[str, Any], handler: TaskHandler
    ) -> Group | None:
        """The group a job in flight joins (None: it names none)."""
        if name is None:
            return None
        key = (name, task, json.dumps(instance, sort_keys=True))
        group = self._by_key.get(key)
        if group is None:
            group = self._by_key[key] = Group(key, handler)
        group.members += 1
        return group

    def leave(self, group: Group) -> None:
        """A member is finished; the template is released once it was the last."""
        group.members -= 1
        if group.members > 0:
            return
        if self._by_key.get(group.key) is group:
            del self._by_key[group.key]
        self._drop(group)

    def _drop(self, group: Group) -> None:
        template, group.template = group.template, None
        if template is not None:
            self._release(group.handler, template)

    async def init_context(
        self, group: Group | None, handler: TaskHandler, job: TaskJob
    ) -> TaskContext:
        """``job``'s context: forked from its group's template (made first by this job's
        ``init`` where the group has none yet), or its own ``init``'s where it is in no group
        or the handler cannot fork. A fork that fails drops the template (its sandbox may be
        what broke): the attempt that runs again makes a new one."""
        fork = context_forker(handler)
        if group is None or fork is None:
            return await handler.init(job)
        async with group.lock:  # one template: the others wait for it
            if group.template is None:
                # The template is the task as INIT sets it up, for every member: never one
                # member's resumed state (each member resumes in its own fork).
                group.template = await handler.init(dataclasses.replace(job, recovered=False))
            template = group.template
        try:
            return await fork(template, job)
        except Exception:
            if group.template is template:
                self._drop(group)
            raise

    def __len__(self) -> int:
        return len(self._by_key)
