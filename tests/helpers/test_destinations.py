"""Destinations as an admin lists them and a proxy client names them: one strict syntax, so that
two spellings of one host compare equal and nothing smuggles another host past a comparison."""

from __future__ import annotations

import pytest

from raas.helpers.destinations import Destination, parse_authority, parse_destination


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("pypi.org", "pypi.org", 443),
        ("files.pythonhosted.org:443", "files.pythonhosted.org", 443),
        ("PyPI.ORG.:8443", "pypi.org", 8443),  # case and one trailing dot: the same host
        ("10.0.0.5:8080", "10.0.0.5", 8080),
        ("[0:0::1]:80", "::1", 80),  # an address in its canonical text
        ("::1", "::1", 443),  # bare IPv6: no port
        ("[::ffff:127.0.0.1]:5", "::ffff:7f00:1", 5),
    ],
)
def test_a_destination_is_read_in_one_canonical_form(text: str, host: str, port: int) -> None:
    assert parse_destination(text) == Destination(host, port)


@pytest.mark.parametrize(
    "text",
    [
        "user@pypi.org:443",  # user info
        "pypi.org@evil.test:443",
        "%31%32%37.0.0.1:80",  # percent-encoding
        "[fe80::1%25eth0]:80",  # an IPv6 zone
        "127.1:80",  # shorthand IPv4, which a resolver would read as 127.0.0.1
        "2130706433:80",  # an address as one number
        "0x7f.0.0.1:80",
        "*.pythonhosted.org",
        "pypi.org:0",
        "pypi.org:+443",
        "pypi.org:65536",
        "pypi.org/simple",
        " pypi.org",
        "-pypi.org",
        "py pi.org",
        "[pypi.org]:443",
        "[::1]x",
        "",
    ],
)
def test_anything_else_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_destination(text)
    assert repr(text) in str(caught.value)


def test_a_proxy_target_names_its_port() -> None:
    assert parse_authority("Example.org:443") == Destination("example.org", 443)
    assert str(parse_authority("[::1]:80")) == "[::1]:80"
    for text in ["example.org", "::1"]:
        with pytest.raises(ValueError, match="names no port"):
            parse_authority(text)
