"""Maps ``instance["data_source"]`` to a task handler.

A data_source is a registered task's name (``math``) or a dataset name that runs as one
(``openai/gsm8k`` runs as ``math``: the alias table of ``raas.tasks.sources``); a registered name
always wins over an alias.

Handlers come from the ``raas.tasks`` entry-point group, so a third-party package registers its
own tasks in its packaging metadata without touching raas:

    [project.entry-points."raas.tasks"]
    my_task = "my_package.tasks:MyTask"

An entry point names either a handler class (instantiated with no arguments) or an instance.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from raas.helpers.suggestions import did_you_mean
from raas.tasks import sources
from raas.tasks.protocol import TaskHandler

ENTRY_POINT_GROUP = "raas.tasks"

log = logging.getLogger(__name__)


class UnknownTask(KeyError):
    def __init__(self, data_source: str, known: list[str], tasks: list[str] | None = None) -> None:
        super().__init__(data_source)
        self.data_source = data_source
        self.known = known  # every name that runs: the tasks', then the dataset names
        self.tasks = known if tasks is None else tasks

    def __str__(self) -> str:
        """One short line: the likeliest name meant, the tasks, and how many dataset names
        (the whole list is ``known``, in a 422's ``ctx``; docs/tasks.md has the table)."""
        aliases = len(self.known) - len(self.tasks)
        hint = suggestion(self.data_source, self.known)
        listed = ", ".join(self.tasks) or "none"
        more = f", and {aliases} dataset names: docs/tasks.md lists them" if aliases else ""
        return f"no task handler for data_source {self.data_source!r} ({hint}tasks: {listed}{more})"


def suggestion(word: str, known: list[str]) -> str:
    """``"did you mean 'x'? "`` for a name ``word`` likely stands for: one that differs in case
    only, or by its ``ORG/`` (``gsm8k`` for ``openai/gsm8k``), else the closest spelling."""
    lowered = word.lower()
    for name in known:
        if lowered in (name.lower(), name.lower().rsplit("/", 1)[-1]):
            return f"did you mean {name!r}? "
    return did_you_mean(word, known)


class TaskRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, TaskHandler] = {}

    def register(self, handler: TaskHandler, name: str | None = None) -> None:
        if not isinstance(handler, TaskHandler):
            raise TypeError(f"{handler!r} does not implement the TaskHandler protocol")
        self._handlers[name or handler.name] = handler

    def resolve(self, data_source: str) -> str:
        """The name of the registered task that runs ``data_source``; UnknownTask if none."""
        if data_source in self._handlers:
            return data_source
        source = sources.lookup(data_source)
        if source is not None and source.task in self._handlers:
            return source.task
        raise UnknownTask(data_source, self.known(), self.names())

    def get(self, data_source: str) -> TaskHandler:
        return self._handlers[self.resolve(data_source)]

    def names(self) -> list[str]:
        """The registered tasks' names."""
        return sorted(self._handlers)

    def aliases(self, task: str) -> list[str]:
        """The dataset names (and ``PREFIX*`` patterns) that run as registered ``task``."""
        return sources.names_for([task]) if task in self._handlers else []

    def known(self) -> list[str]:
        """Every data_source this registry runs: the tasks' names, then the dataset names."""
        return self.names() + sources.names_for(self._handlers)

    def __contains__(self, data_source: object) -> bool:
        if not isinstance(data_source, str):
            return False
        try:
            self.resolve(data_source)
        except UnknownTask:
            return False
        return True

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
