"""Ports: a free one, whether a server could bind one, whether a host is loopback."""

from __future__ import annotations

import errno
import ipaddress
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class PortBusy(RuntimeError):
    """A server's address cannot be bound (in use, or not this machine's)."""


def check_port(host: str, port: int) -> None:
    """Raise PortBusy, in words a person can act on, unless a server could bind ``host:port``
    now (as uvicorn binds, with SO_REUSEADDR). Asked before a server starts, so that a busy
    port is said first, not after the app has logged that it is ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortBusy(
                    f"{host}:{port} is in use (pass --port N, or stop what holds it)"
                ) from e
            raise PortBusy(f"{host}:{port} cannot be bound: {e.strerror}") from e


def is_loopback(host: str) -> bool:
    """Does binding ``host`` listen on this machine's loopback only (``localhost``,
    ``127.0.0.1``, ``::1``, or a name that resolves to nothing else)? ``0.0.0.0``, ``::`` and
    ``""`` (every interface) do not."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), None) if host else []
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found
    )


def port_free(host: str, port: int) -> bool:
    """Could a server bind ``host:port`` now?"""
    try:
        check_port(host, port)
    except PortBusy:
        return False
    return True
