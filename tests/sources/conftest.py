"""Fixtures: a plugin manager with the built-ins (tests/run_fixtures.py)."""

from run_fixtures import pm  # noqa: F401
