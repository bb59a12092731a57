"""The trainer-side SDK. It imports no server code: httpx, pydantic and the wire schemas only."""

from raas.client.http import AsyncRolloutClient, RaasHTTPError

__all__ = ["AsyncRolloutClient", "RaasHTTPError"]
