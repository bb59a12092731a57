"""Fixtures shared by the fault tier's modules (test_faults defines them)."""

from tests.pipeline.test_faults import service  # noqa: F401
