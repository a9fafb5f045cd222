"""One registry class for every kind: duplicates and unknown names say what, where and which."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import rlzoo
from rlzoo.kernel.errors import DuplicateComponentError, PluginError, UnknownComponentError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.kernel.registry import Registry


def _fn(inputs, params):  # type: ignore[no-untyped-def]
    """A part."""


@dataclass(frozen=True)
class _Params:
    """Params of a fake part."""

    alpha: float = rlzoo.param(1.0, help="a knob")


def test_duplicate_name_names_both_plugins() -> None:
    reg: Registry = Registry("advantage")
    reg.register("dup", _fn, plugin="first_plugin")
    with pytest.raises(DuplicateComponentError) as e:
        reg.register("dup", _fn, plugin="second_plugin")
    msg = str(e.value)
    assert "'dup'" in msg and "first_plugin" in msg and "second_plugin" in msg


def test_duplicate_across_plugins_fails_at_load(pm: PluginManager) -> None:
    class Clash:
        @rlzoo.hookimpl
        def rlzoo_register_advantages(self, registry):  # type: ignore[no-untyped-def]
            registry.register("grpo", _fn)

    pm.register(Clash(), "clash_plugin")
    try:
        with pytest.raises(PluginError) as e:
            pm.registries()
        msg = str(e.value)
        assert "rlzoo.algorithms.advantage" in msg and "clash_plugin" in msg and "'grpo'" in msg
    finally:
        pm.unregister("clash_plugin")
    assert pm.registry("advantage").get("grpo").plugin == "rlzoo.algorithms.advantage"


def test_alias_clash_is_a_duplicate() -> None:
    reg: Registry = Registry("kl")
    reg.register("k3", _fn, plugin="a", aliases=["low_var"])
    with pytest.raises(DuplicateComponentError, match="low_var"):
        reg.register("other", _fn, plugin="b", aliases=["low_var"])


def test_unknown_name_names_kind_key_choices_and_closest() -> None:
    reg: Registry = Registry("advantage")
    for name in ("rloo", "grpo", "gae"):
        reg.register(name, _fn, plugin="p")
    with pytest.raises(UnknownComponentError) as e:
        reg.get("gpro", key="algorithm.advantage.name")
    msg = str(e.value)
    assert "unknown advantage 'gpro'" in msg
    assert "'algorithm.advantage.name'" in msg
    assert "gae, grpo, rloo" in msg  # every registered name, sorted
    assert "Did you mean: grpo" in msg


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown kind 'advantages'"):
        Registry("advantages")


def test_component_record() -> None:
    reg: Registry = Registry("advantage")
    comp = reg.register("mine", _fn, plugin="p", params=_Params, capabilities={"needs_group": True})
    assert comp.summary == "Params of a fake part."  # the params docstring is the doc
    assert comp.capability("needs_group") is True and comp.capability("needs_critic") is False
    assert comp.default_params() == _Params()
    assert comp.param_fields() == [
        {"name": "alpha", "type": "float", "default": 1.0, "required": False, "help": "a knob"}
    ]
    assert comp.to_json()["params"][0]["help"] == "a knob"


def test_lazy_target_is_imported_on_first_use() -> None:
    reg: Registry = Registry("kl")
    comp = reg.register("lazy", f"{__name__}:_fn", plugin="p", doc="Lazy.")
    assert not comp.is_loaded
    assert comp.load() is _fn and comp.is_loaded


def test_params_must_be_a_dataclass() -> None:
    reg: Registry = Registry("kl")
    with pytest.raises(TypeError, match="params must be a dataclass type"):
        reg.register("bad", _fn, plugin="p", params=dict)
