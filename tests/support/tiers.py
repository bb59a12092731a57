"""What a slow tier needs, and what happens where it is missing.

A tier's tests import their packages through ``require``: in ``make test``, which deselects the
tier, a missing package is a skip whose reason names the tier and the target that installs it
(``-rs`` prints it in the summary); where the tier was asked for by its marker (``make
test-verl`` runs ``-m verl``), the same absence fails, so that a tier never passes having run
nothing.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

import pytest

# The -m expression of this run, set by conftest.py's pytest_configure.
MARK_EXPRESSION = ""


def selected(tier: str) -> bool:
    """Whether this run asked for ``tier`` by its marker (``-m verl``, ``-m 'faults or
    oracle'``), as opposed to deselecting it (``not verl``, make test's default)."""
    return re.search(rf"(?<!not )\b{re.escape(tier)}\b", MARK_EXPRESSION) is not None


def require(module: str, tier: str, target: str) -> ModuleType:
    """Import ``module`` for the ``tier`` tier's tests; ``target`` is the make target that
    installs it. Call it at module level or in a fixture."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        why = f"the {tier} tier needs {module} ({e}): `{target}` installs it"
    if selected(tier):
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)
