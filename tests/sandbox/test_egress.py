"""The egress policy: which destinations an admin's list allows, which addresses count as
public, and the address a target is connected to (resolved once, checked, never again)."""

from __future__ import annotations

import ipaddress
import re

import pytest

from raas.helpers.destinations import Destination, IPAddress
from raas.sandbox.egress import EgressPolicy, Refused, Resolver, checked_addresses, is_public

POLICY = EgressPolicy.parse(["pypi.org", "files.pythonhosted.org:443", "mirror.test:8080"])


def test_an_admins_list_allows_each_host_on_its_port() -> None:
    assert POLICY.allows(Destination("pypi.org", 443))
    assert not POLICY.allows(Destination("pypi.org", 80))  # no port said: 443 only
    assert POLICY.allows(Destination("mirror.test", 8080))
    assert not POLICY.allows(Destination("mirror.test", 443))
    assert not POLICY.allows(Destination("evil.test", 443))
    assert not EgressPolicy()  # the default: nothing


def test_a_bad_entry_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=re.escape("'pypi.org@evil.test'")):
        EgressPolicy.parse(["pypi.org", "pypi.org@evil.test"])


def test_a_task_narrows_the_list_to_its_own_hosts() -> None:
    asked = [Destination("pypi.org"), Destination("mirror.test", 8080)]
    assert POLICY.only(asked) == EgressPolicy.parse(["pypi.org:443", "mirror.test:8080"])
    assert POLICY.only([Destination("mirror.test", 443)]) == EgressPolicy()
    assert POLICY.missing([*asked, Destination("github.com")]) == [Destination("github.com")]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.0.1",
        "169.254.169.254",  # the cloud's metadata service
        "169.254.0.1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "0.0.0.0",
        "::",
        "100.64.0.1",  # carrier-grade NAT
        "224.0.0.1",
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::",  # 6to4 of the metadata address
    ],
)
def test_addresses_that_are_not_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.215.14", "151.101.0.223", "2606:4700::6810:84e5"])
def test_public_addresses(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


def resolver(*answers: str) -> tuple[list[str], Resolver]:
    """A resolver that answers ``answers`` and keeps the names it was asked."""
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[IPAddress]:
        asked.append(host)
        return [ipaddress.ip_address(a) for a in answers]

    return asked, resolve


async def test_a_listed_name_is_connected_to_at_the_public_addresses_it_resolved_to() -> None:
    asked, resolve = resolver("10.0.0.7", "2606:4700::6810:84e5", "151.101.0.223", "127.0.0.1")
    found = await checked_addresses(Destination("pypi.org", 443), POLICY, resolve)
    assert [str(a) for a in found] == ["2606:4700::6810:84e5", "151.101.0.223"]
    assert asked == ["pypi.org"]


@pytest.mark.parametrize(
    "answers",
    [("127.0.0.1",), ("169.254.169.254",), ("10.0.0.7", "192.168.1.1"), ("::ffff:127.0.0.1",)],
)
async def test_a_listed_name_that_resolves_only_inside_is_refused(answers: tuple[str]) -> None:
    _, resolve = resolver(*answers)
    with pytest.raises(Refused) as caught:
        await checked_addresses(Destination("pypi.org", 443), POLICY, resolve)
    assert caught.value.status == 403 and "not public" in str(caught.value)


async def test_an_address_the_admin_lists_is_allowed_though_not_public() -> None:
    policy = EgressPolicy.parse(["127.0.0.1:8080", "internal.test:8080"])
    _, resolve = resolver("127.0.0.1")
    found = await checked_addresses(Destination("127.0.0.1", 8080), policy)
    assert [str(a) for a in found] == ["127.0.0.1"]
    found = await checked_addresses(Destination("internal.test", 8080), policy, resolve)
    assert [str(a) for a in found] == ["127.0.0.1"]
    with pytest.raises(Refused):  # the same address on a port not listed
        await checked_addresses(Destination("127.0.0.1", 8081), policy)


async def test_a_target_not_listed_is_never_resolved() -> None:
    asked, resolve = resolver("151.101.0.223")
    with pytest.raises(Refused) as caught:
        await checked_addresses(Destination("evil.test", 443), POLICY, resolve)
    assert caught.value.status == 403 and asked == []
