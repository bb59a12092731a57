"""Tasks: the TaskHandler protocol, the registry and the shipped tasks."""

from raas.tasks.protocol import InvalidInstance, RewardInfo, TaskContext, TaskHandler, TaskJob
from raas.tasks.registry import TaskRegistry, UnknownTask

__all__ = [
    "InvalidInstance",
    "RewardInfo",
    "TaskContext",
    "TaskHandler",
    "TaskJob",
    "TaskRegistry",
    "UnknownTask",
]
