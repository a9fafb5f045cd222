"""rlzoo: a pluggable zoo of RL algorithms for LLM post-training.

The names exported here are the public API. Importing rlzoo is cheap: it does not import torch.

- :data:`hookimpl` marks a plugin's hook implementations (see :mod:`rlzoo.kernel.hookspecs`); a
  ``rlzoo_register_<kind>s`` hook receives a :class:`Registrar` and calls its ``register`` per part.
- :func:`param` declares a documented field of a part's params dataclass.
- :func:`get_plugin_manager` gives the registries (``get_plugin_manager().registry("advantage")``).
- :func:`build_run` composes a run from a recipe name, a config, or objects passed directly.
"""

from __future__ import annotations

from rlzoo.kernel.errors import ConfigError, PluginError, RlzooError, UnknownComponentError
from rlzoo.kernel.hookspecs import hookimpl
from rlzoo.kernel.kinds import KIND_NAMES, KINDS
from rlzoo.kernel.params import param
from rlzoo.kernel.plugins import get_plugin_manager, reset_plugin_manager
from rlzoo.kernel.registry import Component, Registrar, Registry
from rlzoo.recipe.compose import Run, build_run, part
from rlzoo.version import __version__

__all__ = [
    "KINDS",
    "KIND_NAMES",
    "Component",
    "ConfigError",
    "PluginError",
    "Registrar",
    "Registry",
    "RlzooError",
    "Run",
    "UnknownComponentError",
    "__version__",
    "build_run",
    "get_plugin_manager",
    "hookimpl",
    "param",
    "part",
    "reset_plugin_manager",
]
