"""Fixtures: fresh plugin managers around each test (tests/plugin_fixtures.py)."""

from plugin_fixtures import _isolated, default_pm, example, pm  # noqa: F401
