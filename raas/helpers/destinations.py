"""Network destinations as an admin lists them and as a proxy client names them.

One syntax for both, strict, so that a name can be compared by its text: ``HOST``, ``HOST:PORT``,
``IPV4``, ``IPV4:PORT``, ``[IPV6]`` or ``[IPV6]:PORT`` (an IPv6 address without a port may go
without its brackets). A host name is ASCII letters, digits and hyphens in dot-separated labels,
compared in lower case and without a trailing dot; its last label is not all digits (``127.1`` or
``2130706433`` would be read as an address by the resolver). An address is written canonically
by the standard library (``0:0::1`` is ``::1``). No user info, percent-encoding, wildcard, path or
space: anything else is a ValueError naming the text.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
HTTPS_PORT = 443
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_PORT = re.compile(r"[0-9]{1,5}")
# Every character a destination may hold: no "@" (user info), "%" (encoding, an IPv6 zone), "/".
_CHARS = re.compile(r"[A-Za-z0-9.:\[\]-]+")


@dataclass(frozen=True)
class Destination:
    """A host (a lower-case name, or an address in its canonical text) and a port; ``port``
    None (only where a task names a host) means any port the admin allows for it."""

    host: str
    port: int | None = None

    @property
    def address(self) -> IPAddress | None:
        """The host as an address, None where it is a name."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse_destination(text: str, default_port: int | None = HTTPS_PORT) -> Destination:
    """``text`` as a Destination; ``default_port`` where it names none (None: none is needed)."""
    if not isinstance(text, str) or not text or text != text.strip():
        raise ValueError(f"{text!r}: not a destination (HOST, HOST:PORT or [IPV6]:PORT)")
    if "*" in text:
        raise ValueError(f"{text!r}: no wildcards: list each host")
    if not _CHARS.fullmatch(text):
        raise ValueError(f"{text!r}: only a host or address and a port (no user info, no %)")
    host, port = _split(text)
    return Destination(_host(host, text), default_port if port is None else _port(port, text))


def parse_authority(text: str) -> Destination:
    """A proxy request's target (CONNECT's ``HOST:PORT``): a port is required."""
    destination = parse_destination(text, default_port=None)
    if destination.port is None:
        raise ValueError(f"{text!r}: names no port")
    return destination


def _split(text: str) -> tuple[str, str | None]:
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")) or ":" not in host:
            raise ValueError(f"{text!r}: a bracketed host is an IPv6 address: [ADDRESS]:PORT")
        return host, rest[1:] if rest else None
    if text.count(":") > 1:  # a bare IPv6 address: it cannot carry a port
        return text, None
    host, colon, port = text.partition(":")
    return host, port if colon else None


def _host(host: str, text: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host.lower().removesuffix(".")
    labels = name.split(".")
    if (
        not name
        or len(name) > 253
        or not all(_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise ValueError(f"{text!r}: {host!r} is neither a host name nor an IP address")
    return name


def _port(port: str, text: str) -> int:
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port is not a number in 1..65535")
    return int(port)
