"""A tier asked for by its marker fails where its packages are missing; make test skips it."""

from __future__ import annotations

import pytest

from tests.support import tiers


@pytest.mark.parametrize(
    ("expression", "asked"),
    [
        ("verl", True),
        ("faults or verl", True),
        ("not slow and not verl and not oracle", False),
        ("", False),
        ("verlx", False),
    ],
)
def test_a_tier_is_asked_for_only_by_its_own_marker(
    expression: str, asked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiers, "MARK_EXPRESSION", expression)
    assert tiers.selected("verl") is asked


def test_a_missing_package_fails_the_tier_that_asked_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tiers, "MARK_EXPRESSION", "verl")
    with pytest.raises(pytest.fail.Exception, match="make test-verl"):
        tiers.require("raas_no_such_module", "verl", "make test-verl")


def test_a_missing_package_skips_the_tier_in_make_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiers, "MARK_EXPRESSION", "not slow and not verl")
    with pytest.raises(pytest.skip.Exception, match="the verl tier needs raas_no_such_module"):
        tiers.require("raas_no_such_module", "verl", "make test-verl")
    assert tiers.require("json", "verl", "make test-verl").dumps([]) == "[]"
