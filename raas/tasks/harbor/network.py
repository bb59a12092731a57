"""A Harbor task's network: what an admin allows it, through raas's proxy (raas.sandbox.proxy).

A raas sandbox has no network. A task that asks for it (``NetworkAsk``: the agent's, from
``[agent]`` or ``[environment]``; the verifier's, from ``[verifier]`` alone) is admitted only
where the server's ``egress_allow`` setting lists destinations, and for an allowlist only where it
lists every host the task names; the phase's sandbox then gets the proxy at 127.0.0.1:PORT,
allowing the admin's destinations (``public``) or those of them the task names (``allowlist``),
and the variables that send HTTP clients there. Anything else is refused at submission, in one
line naming the task.
"""

from __future__ import annotations

import shlex

from raas.helpers.destinations import parse_destination
from raas.sandbox import Sandbox
from raas.sandbox.egress import EgressPolicy
from raas.sandbox.proxy import EgressCaps, proxy_env
from raas.tasks.harbor.config import NetworkAsk

SETTING = "egress_allow"


class NetworkRefused(ValueError):
    """A task asks for the network this server does not allow it."""


def phase_policy(ask: NetworkAsk, allowed: EgressPolicy) -> EgressPolicy:
    """The destinations a phase that asks ``ask`` may reach, of the admin's ``allowed``: none
    where it asks none; NetworkRefused (its message says why) where it cannot be served."""
    if not ask:
        return EgressPolicy()
    if not allowed:
        raise NetworkRefused(
            "asks for the network, which a raas sandbox has only through the proxy an admin"
            f" allows with the {SETTING} setting, empty on this server (docs/harbor.md)"
        )
    if ask.public:
        return allowed
    hosts = [parse_destination(host, default_port=None) for host in ask.hosts]
    missing = allowed.missing(hosts)
    if missing:
        names = ", ".join(str(host) for host in missing)
        raise NetworkRefused(
            f"asks for {names}, which this server's {SETTING} setting does not list"
            " (docs/harbor.md)"
        )
    return allowed.only(hosts)


async def open_network(
    sandbox: Sandbox, ask: NetworkAsk, allowed: EgressPolicy, caps: EgressCaps
) -> dict[str, str]:
    """The proxy opened in ``sandbox`` for a phase that asks ``ask``, and its variables (none
    where it asks nothing)."""
    policy = phase_policy(ask, allowed)
    if not policy:
        return {}
    return proxy_env(await sandbox.open_egress(policy, caps))


def exports(env: dict[str, str]) -> str:
    """A shell command that exports ``env``."""
    return "export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
