"""The trainer-side SDK. It imports no server code: httpx, pydantic and the wire schemas only."""

from raas.client.dapo import DapoReport, collect_groups, reward_varies
from raas.client.http import AsyncRolloutClient, RaasHTTPError
from raas.client.multi import Group, RolloutClient, ServerDown, SyncRolloutClient

__all__ = [
    "AsyncRolloutClient",
    "DapoReport",
    "Group",
    "RaasHTTPError",
    "RolloutClient",
    "ServerDown",
    "SyncRolloutClient",
    "collect_groups",
    "reward_varies",
]
