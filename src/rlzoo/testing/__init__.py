"""Test helpers for plugin authors: conformance suites per kind and :func:`check_component`.

A plugin package runs rlzoo's contract checks against its own parts by subclassing the suite of
the part's kind in a pytest module (the class name must start with ``Test``)::

    from rlzoo.testing import AdvantageConformance

    class TestExampleRLOO(AdvantageConformance):
        name = "example_rloo"
        params_overrides = {"baseline_weight": 0.5}   # optional

The suite looks the part up in the registry (so the plugin must be installed, or registered by
overriding :meth:`ComponentConformance.plugin_manager`) and checks its registration, its params
and the contract of its kind (shapes, masks, edge cases, determinism).

Importing this package imports neither torch nor any backend; the suites import torch inside
their tests.
"""

from __future__ import annotations

# the suites and their helpers, listed once: rlzoo.testing.conformance.__all__
from rlzoo.testing.conformance import *  # noqa: F403
from rlzoo.testing.conformance import __all__ as __all__
