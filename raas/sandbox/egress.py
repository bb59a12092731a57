"""Where a sandbox's proxy may connect: an admin's allow-list, and the checks of one target.

A sandbox has no network. With an ``EgressPolicy`` (``Sandbox.open_egress``), raas's proxy
(``raas.sandbox.proxy``) carries its CONNECT requests to the destinations the policy lists and
to nothing else: a target is allowed when its host and port are listed (by name, or by address
for an address), and then connected to at an address checked here: a name is resolved once, and
each address it gives must be public (``is_public``) unless the admin lists that very address
with that port; the proxy connects to the address that passed, never to the name again (a second
lookup could answer otherwise: DNS rebinding).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from raas.helpers.destinations import Destination, IPAddress, parse_destination

# A name's addresses: (host, port) -> addresses. The default asks the system's resolver.
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


class Refused(Exception):
    """A target the proxy will not connect to: ``status`` is the HTTP answer (403, 400, 502)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class EgressPolicy:
    """The destinations a sandbox's proxy may reach (each a host and a port)."""

    allowed: frozenset[Destination] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> EgressPolicy:
        """An admin's list (``pypi.org:443``, ``10.0.0.5:8080``...; no port: 443); a
        ValueError naming the first entry that is not a destination."""
        return cls(frozenset(parse_destination(entry) for entry in entries))

    def __bool__(self) -> bool:
        return bool(self.allowed)

    def allows(self, target: Destination) -> bool:
        return target in self.allowed

    def only(self, hosts: Iterable[Destination]) -> EgressPolicy:
        """This policy narrowed to ``hosts`` (a task's): each host on any port listed here for
        it, or on its own port where it names one."""
        wanted = list(hosts)
        return EgressPolicy(
            frozenset(
                d
                for d in self.allowed
                if any(d.host == h.host and h.port in (None, d.port) for h in wanted)
            )
        )

    def missing(self, hosts: Iterable[Destination]) -> list[Destination]:
        """Those of ``hosts`` this policy allows on no port (or not on the port they name)."""
        return [h for h in hosts if not self.only([h])]


# IPv6 prefixes whose low 32 bits are an IPv4 address: NAT64's well-known prefix (a DNS64
# resolver answers a name whose A record is 10.0.0.5 with 64:ff9b::a00:5, which a NAT64 gateway
# takes to 10.0.0.5), the IPv4-compatible and the IPv4-translated forms. Python's is_global
# looks through none of them.
EMBEDS_IPV4 = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "::/96", "::ffff:0:0:0/96"))
# Never public, whatever Python says: NAT64's local-use prefix (an operator's own translation,
# to its own networks; its IPv4 bits are not at a fixed place) and the old site-local range.
NOT_PUBLIC_V6 = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b:1::/48", "fec0::/10"))


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is on the public internet: not loopback, private, link-local (the
    cloud's metadata service at 169.254.169.254), unspecified, CGNAT, multicast or reserved, nor
    an IPv6 form of one (IPv4-mapped, 6to4, NAT64, IPv4-compatible, IPv4-translated)."""
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in network for network in NOT_PUBLIC_V6):
            return False
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and any(address in network for network in EMBEDS_IPV4):
            inner = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
        if inner is not None:
            return is_public(inner)
    return address.is_global and not address.is_multicast


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """``host``'s TCP addresses from the system's resolver (in a thread: getaddrinfo blocks)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos]


async def checked_addresses(
    target: Destination,
    policy: EgressPolicy,
    resolve: Resolver = system_resolver,
    timeout_s: float = 10.0,
) -> list[IPAddress]:
    """The addresses to connect to for ``target`` (which names a port), in the resolver's
    order; Refused (403) where the policy does not list it or it leads only to addresses that
    are not public and not listed (those are left out)."""
    assert target.port is not None
    if not policy.allows(target):
        raise Refused(403, f"{target} is not on this server's egress allow-list")
    address = target.address
    if address is not None:  # an address listed as such is the admin's own choice
        return [address]
    try:
        found = await asyncio.wait_for(resolve(target.host, target.port), timeout_s)
    except (OSError, TimeoutError) as e:
        raise Refused(502, f"{target.host} does not resolve: {e or 'timed out'}") from None
    passed = [
        address
        for address in dict.fromkeys(found)
        if is_public(address) or policy.allows(Destination(str(address), target.port))
    ]
    if not passed:
        said = ", ".join(sorted({str(a) for a in found})) or "nothing"
        raise Refused(403, f"{target.host} resolves to {said}, which is not public (not allowed)")
    return passed
