"""The trainer-side SDK. It imports no server code: httpx, pydantic, the wire types and the shared
helpers only."""

from raas.client.batch import Batch, to_batch
from raas.client.dapo import DapoReport, collect_groups, reward_varies
from raas.client.metrics import MetricsLogger, dapo_metrics, rollout_metrics
from raas.client.rollout_client import Group, RolloutClient, ServerDown, SyncRolloutClient
from raas.client.single_server import AsyncRolloutClient, RaasHTTPError
from raas.helpers.server_list import ServerListError, read_server_list
from raas.wire import RolloutRequest, RolloutResult

__all__ = [
    "AsyncRolloutClient",
    "Batch",
    "DapoReport",
    "Group",
    "MetricsLogger",
    "RaasHTTPError",
    "RolloutClient",
    "RolloutRequest",
    "RolloutResult",
    "ServerDown",
    "ServerListError",
    "SyncRolloutClient",
    "collect_groups",
    "dapo_metrics",
    "read_server_list",
    "reward_varies",
    "rollout_metrics",
    "to_batch",
]
