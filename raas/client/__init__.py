"""The trainer-side SDK. It imports no server code: httpx, pydantic and the wire schemas only."""

from raas.client.batch import Batch, to_batch
from raas.client.dapo import DapoReport, collect_groups, reward_varies
from raas.client.rollout_client import Group, RolloutClient, ServerDown, SyncRolloutClient
from raas.client.servers import ServerListError, read_server_list
from raas.client.single_server import AsyncRolloutClient, RaasHTTPError

__all__ = [
    "AsyncRolloutClient",
    "Batch",
    "DapoReport",
    "Group",
    "RaasHTTPError",
    "RolloutClient",
    "ServerDown",
    "ServerListError",
    "SyncRolloutClient",
    "collect_groups",
    "read_server_list",
    "reward_varies",
    "to_batch",
]
