"""Maps ``instance["data_source"]`` to a task handler.

Handlers come from the ``raas.tasks`` entry-point group, so a third-party package registers its
own tasks in its packaging metadata without touching raas:

    [project.entry-points."raas.tasks"]
    my_task = "my_package.tasks:MyTask"

An entry point names either a handler class (instantiated with no arguments) or an instance.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from raas.tasks.protocol import TaskHandler

ENTRY_POINT_GROUP = "raas.tasks"

log = logging.getLogger(__name__)


class UnknownTask(KeyError):
    def __init__(self, data_source: str, known: list[str]) -> None:
        super().__init__(data_source)
        self.data_source = data_source
        self.known = known

    def __str__(self) -> str:
        known = ", ".join(self.known) or "none"
        return f"no task handler for data_source {self.data_source!r} (registered: {known})"


class TaskRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, TaskHandler] = {}

    def register(self, handler: TaskHandler, name: str | None = None) -> None:
        if not isinstance(handler, TaskHandler):
            raise TypeError(f"{handler!r} does not implement the TaskHandler protocol")
        self._handlers[name or handler.name] = handler

    def get(self, data_source: str) -> TaskHandler:
        try:
            return self._handlers[data_source]
        except KeyError:
            raise UnknownTask(data_source, self.names()) from None

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, data_source: object) -> bool:
        return data_source in self._handlers

    @classmethod
    def from_entry_points(cls, group: str = ENTRY_POINT_GROUP) -> TaskRegistry:
        """A registry of every handler installed under the entry-point group.

        A handler that fails to load is logged and skipped, so one broken plugin does not take
        the service down with it.
        """
        registry = cls()
        for ep in entry_points(group=group):
            try:
                obj = ep.load()
                handler = obj() if isinstance(obj, type) else obj
                registry.register(handler, name=ep.name)
            except Exception:
                log.exception("could not load task handler %r from %s", ep.name, ep.value)
        return registry
