"""The alias table's own name for a data_source (raas.tasks.sources.canonical): what /metrics
counts a dataset's jobs under, one of a fixed set of names whatever a client wrote."""

from __future__ import annotations

import pytest

from raas.tasks.sources import ALIASES, PREFIXES, canonical, lookup, names_for


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_each_alias_in_any_case_is_named_as_the_table_spells_it(name: str) -> None:
    for spelled in (name, name.upper(), name.lower(), name.swapcase()):
        assert canonical(spelled) == name, spelled


@pytest.mark.parametrize(
    ("data_source", "name"),
    [
        ("aime_2024", "aime*"),
        ("AIME25", "aime*"),
        ("aime" + "x" * 1_000_000, "aime*"),  # a megabyte: one name all the same
        ("deepcoder", "deepcoder"),  # an alias first, as lookup finds it
        ("deepcoder_v2", "deepcoder*"),
        ("openai/gsm8k-x", None),
        ("countdown", None),  # a task's own name is no alias
        ("", None),
    ],
)
def test_a_prefix_takes_any_tail_under_its_pattern(data_source: str, name: str | None) -> None:
    assert canonical(data_source) == name
    assert (canonical(data_source) is None) == (lookup(data_source) is None)


def test_every_name_it_gives_is_one_the_table_lists() -> None:
    tasks = {source.task for source in [*ALIASES.values(), *PREFIXES.values()]}
    listed = set(names_for(tasks))
    given = {canonical(n) for n in [*ALIASES, *(p + "-anything" for p in PREFIXES)]}
    assert given == listed
