"""The plugin manager: built-ins, entry points, run-time registration, validation, env vars."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from plugin_fixtures import EXAMPLE_DIST

import rlzoo
from rlzoo.kernel import plugins as plugins_mod
from rlzoo.kernel.errors import PluginError, closest
from rlzoo.kernel.plugins import BUILTIN_PLUGINS, ENV_ALLOW, ENV_NO_AUTOLOAD, PluginLoadWarning, PluginManager


def _fn(inputs, params):  # type: ignore[no-untyped-def]
    """Fake part."""


class FakePlugin:
    """Registers one advantage and one scorer (what a test registers in a fixture)."""

    @rlzoo.hookimpl
    def rlzoo_register_advantages(self, registry):  # type: ignore[no-untyped-def]
        registry.register("fake_adv", _fn, doc="A fake advantage.", capabilities={"needs_group": True})

    @rlzoo.hookimpl
    def rlzoo_register_scorers(self, registry):  # type: ignore[no-untyped-def]
        registry.register("fake_scorer", _fn, doc="A fake scorer.")


@pytest.fixture
def fake_plugin(pm: PluginManager) -> Iterator[str]:
    name = pm.register(FakePlugin(), "fake", version="1.2.3")
    yield name
    pm.unregister(name)


def test_builtins_are_ordinary_plugins(pm: PluginManager) -> None:
    infos = {i.name: i for i in pm.plugins(include_all=True)}
    for modname in BUILTIN_PLUGINS:
        assert infos[modname].builtin and infos[modname].status == "loaded"
    assert pm.registry("advantage").get("grpo").plugin == "rlzoo.algorithms.advantage"


def test_builtin_datasets_environments_and_tools_live_with_their_tasks(pm: PluginManager) -> None:
    """One home for a task: its dataset, environment and tool are registered from ``rlzoo.tasks``,
    never from ``rlzoo.algorithms`` (which holds algorithms only)."""
    homes = {
        (comp.kind, comp.name): comp.plugin
        for kind in ("dataset", "environment", "tool")
        for comp in pm.registry(kind)
        if comp.plugin.startswith("rlzoo.")
    }
    assert homes[("environment", "tool_arithmetic")] == homes[("tool", "calc")] == "rlzoo.tasks.tools"
    assert {p for p in homes.values() if not p.startswith("rlzoo.tasks.")} == set(), homes


def test_registered_plugin_is_listed_and_its_parts_stamped(pm: PluginManager, fake_plugin: str) -> None:
    assert pm.get("advantage", "fake_adv").plugin == "fake"
    info = {i.name: i for i in pm.plugins()}["fake"]
    assert info.version == "1.2.3" and info.status == "loaded" and not info.builtin
    assert info.hooks == ["rlzoo_register_advantages", "rlzoo_register_scorers"]
    assert info.parts == ["advantage:fake_adv", "scorer:fake_scorer"]


def test_a_module_plugin_registers_its_parts(pm: PluginManager) -> None:
    """A module whose hook function calls ``registry.register`` (as every built-in does): aliases,
    capabilities, the doc of the part and a lazy ``"module:attr"`` target."""
    import types

    @rlzoo.hookimpl
    def rlzoo_register_scorers(registry: rlzoo.Registrar[Any]) -> None:
        registry.register("declared_b", _fn, capabilities={"batched": True}, aliases=("decl_b",))
        registry.register("declared_a", "rlzoo.kernel.errors:closest")

    mod = types.ModuleType("declared_plugin")
    mod.rlzoo_register_scorers = rlzoo_register_scorers  # type: ignore[attr-defined]
    name = pm.register(mod, "declared")
    try:
        info = {i.name: i for i in pm.plugins()}["declared"]
        assert info.hooks == ["rlzoo_register_scorers"]
        assert info.parts == ["scorer:declared_a", "scorer:declared_b"]
        b = pm.get("scorer", "decl_b")
        assert (b.name, b.plugin, b.target, b.doc) == ("declared_b", "declared", _fn, "Fake part.")
        assert b.capability("batched") is True
        assert pm.get("scorer", "declared_a").load() is closest
    finally:
        pm.unregister(name)


def test_unregister_removes_the_parts(pm: PluginManager) -> None:
    pm.register(FakePlugin(), "fake")
    assert "fake_adv" in pm.registry("advantage")
    pm.unregister("fake")
    assert "fake_adv" not in pm.registry("advantage")
    assert "fake" not in {i.name for i in pm.plugins(include_all=True)}


def test_misspelt_hook_names_plugin_hook_and_suggestion(pm: PluginManager) -> None:
    class Misspelt:
        @rlzoo.hookimpl
        def rlzoo_register_advantage(self, registry):  # type: ignore[no-untyped-def]  (no trailing s)
            registry.register("never", _fn)

    with pytest.raises(PluginError) as e:
        pm.register(Misspelt(), "misspelt_plugin")
    msg = str(e.value)
    assert "'misspelt_plugin'" in msg and "'rlzoo_register_advantage'" in msg
    assert "did you mean 'rlzoo_register_advantages'" in msg
    # the manager is left as it was: the same name registers again once fixed
    assert "misspelt_plugin" not in {i.name for i in pm.plugins(include_all=True)}
    pm.register(FakePlugin(), "misspelt_plugin")
    pm.unregister("misspelt_plugin")


def test_argument_not_in_spec_names_plugin_hook_and_argument(pm: PluginManager) -> None:
    class ExtraArg:
        @rlzoo.hookimpl
        def rlzoo_register_kls(self, registry, config):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(PluginError) as e:
        pm.register(ExtraArg(), "extra_arg_plugin")
    msg = str(e.value)
    assert "extra_arg_plugin" in msg and "rlzoo_register_kls" in msg and "config" in msg


def test_one_plugin_object_is_registered_once(pm: PluginManager) -> None:
    class Once:
        @rlzoo.hookimpl(specname="rlzoo_register_loss_aggs")
        def register_under_another_name(self, registry):  # type: ignore[no-untyped-def]
            registry.register("once_agg", _fn)

    plugin = Once()
    pm.register(plugin, "once_plugin")
    try:
        with pytest.raises(PluginError, match="'twice_plugin' could not be registered: it is already"):
            pm.register(plugin, "twice_plugin")
        assert pm.registry("loss_agg").get("once_agg").plugin == "once_plugin"  # specname hooks too
    finally:
        pm.unregister("once_plugin")


def test_hook_that_raises_names_plugin_and_hook(pm: PluginManager) -> None:
    class Raises:
        @rlzoo.hookimpl
        def rlzoo_register_loss_aggs(self, registry):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    pm.register(Raises(), "raising_plugin")
    try:
        with pytest.raises(
            PluginError, match=r"'raising_plugin' failed in hook rlzoo_register_loss_aggs.*boom"
        ):
            pm.registries()
    finally:
        pm.unregister("raising_plugin")


# -- entry points ---------------------------------------------------------------------------------
@pytest.fixture
def add_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``add(name=module source, ...)``: each source becomes the module ``rlzoo_test_<name>_plugin``
    on sys.path, listed as entry point ``name`` of the ``rlzoo`` group after the installed ones."""
    added: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))
    real = md.entry_points

    def entry_points(**kw):  # type: ignore[no-untyped-def]
        eps = list(real(**kw))
        if kw.get("group") == "rlzoo":
            eps += [md.EntryPoint(name, f"rlzoo_test_{name}_plugin", "rlzoo") for name in added]
        return eps

    def add(**sources: str) -> None:
        for name, source in sources.items():
            (tmp_path / f"rlzoo_test_{name}_plugin.py").write_text(source)
            added.append(name)

    monkeypatch.setattr(plugins_mod.md, "entry_points", entry_points)
    yield add
    for name in added:
        sys.modules.pop(f"rlzoo_test_{name}_plugin", None)


@pytest.fixture
def fake_entry_points(add_entry_points: Callable[..., None]) -> None:
    """Two more entry points: one whose module raises on import, one that works."""
    add_entry_points(
        broken="raise RuntimeError('broken on purpose')\n",
        good="import rlzoo\n\n"
        "def fn(inputs, params):\n    '''Good.'''\n\n"
        "@rlzoo.hookimpl\n"
        "def rlzoo_register_sample_filters(registry):\n"
        "    registry.register('good_filter', fn, doc='A filter from a good plugin.')\n",
    )


@pytest.mark.usefixtures("fake_entry_points")
def test_plugin_raising_on_import_warns_and_others_load() -> None:
    with pytest.warns(PluginLoadWarning, match=r"'broken'.*RuntimeError: broken on purpose"):
        pm = PluginManager()
    infos = {i.name: i for i in pm.plugins(include_all=True)}
    assert infos["broken"].status == "failed" and "broken on purpose" in (infos["broken"].error or "")
    assert infos["good"].status == "loaded"
    assert pm.get("sample_filter", "good_filter").plugin == "good"
    assert "grpo" in pm.registry("advantage")


@pytest.mark.usefixtures("fake_entry_points")
def test_allow_list_blocks_the_others_by_entry_point_name() -> None:
    pm = PluginManager(allow=["good"])
    infos = {i.name: i for i in pm.plugins(include_all=True)}
    assert infos["good"].status == "loaded"
    assert infos["broken"].status == "blocked"  # never imported, so no warning


@pytest.mark.usefixtures("fake_entry_points")
def test_disabled_autoload_loads_builtins_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_NO_AUTOLOAD, "1")
    pm = PluginManager()
    infos = {i.name: i for i in pm.plugins(include_all=True)}
    assert infos["good"].status == "disabled" and infos["broken"].status == "disabled"
    assert "good_filter" not in pm.registry("sample_filter")
    assert "grpo" in pm.registry("advantage")


# -- the real example plugin through the CLI, in a subprocess -------------------------------------
def _cli_json(*args: str, **env: str) -> object:
    full_env = {k: v for k, v in os.environ.items() if k not in (ENV_ALLOW, ENV_NO_AUTOLOAD)}
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", *args], capture_output=True, text=True, env=full_env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.usefixtures("example")
@pytest.mark.parametrize(
    ("env", "status"),
    [
        ({}, "loaded"),
        ({ENV_ALLOW: ""}, "blocked"),
        ({ENV_ALLOW: "someone_else"}, "blocked"),
        ({ENV_ALLOW: "example"}, "loaded"),  # entry-point name
        ({ENV_ALLOW: f"other,{EXAMPLE_DIST}"}, "loaded"),  # distribution name
        ({ENV_NO_AUTOLOAD: "1"}, "disabled"),
    ],
)
def test_env_vars_control_the_example_plugin(env: dict[str, str], status: str) -> None:
    infos = {i["name"]: i for i in _cli_json("plugins", "--all", "--json", **env)}  # type: ignore[union-attr]
    assert infos["example"]["status"] == status
    assert infos["example"]["distribution"] == EXAMPLE_DIST
    assert infos["rlzoo.algorithms.advantage"]["status"] == "loaded"  # built-ins always load


# -- hooks go through pluggy's caller; a misspelt hook skips only its plugin ----------------------
def test_register_hooks_are_called_through_pluggys_hook_caller(pm: PluginManager) -> None:
    """A hook wrapper runs around the registration call and tryfirst ordering is honoured: both
    happen only when the hook is called through ``pm.hook.<name>(...)``."""
    calls: list[str] = []

    class Wrapper:
        @rlzoo.hookimpl(wrapper=True)
        def rlzoo_register_advantages(self, registry):  # type: ignore[no-untyped-def]
            calls.append("before")
            result = yield
            calls.append("after")
            return result

    class First:
        @rlzoo.hookimpl(tryfirst=True)
        def rlzoo_register_advantages(self, registry):  # type: ignore[no-untyped-def]
            calls.append("first")
            registry.register("first_adv", _fn)

    pm.register(First(), "first_plugin")
    pm.register(Wrapper(), "wrapper_plugin")
    try:
        reg = pm.registry("advantage")
        assert calls == ["before", "first", "after"]
        assert reg.get("first_adv").plugin == "first_plugin"
        assert reg.get("grpo").plugin == "rlzoo.algorithms.advantage"  # stamped per implementation
    finally:
        pm.unregister("first_plugin")
        pm.unregister("wrapper_plugin")


def test_misspelt_hook_in_an_entry_point_plugin_lists_the_rest(add_entry_points: Callable[..., None]) -> None:
    add_entry_points(
        misspelt="import rlzoo\n\n@rlzoo.hookimpl\ndef rlzoo_register_advantage(registry):\n    pass\n"
    )
    with pytest.warns(PluginLoadWarning, match=r"'misspelt'.*rlzoo_register_advantages"):
        pm = PluginManager()
    infos = {i.name: i for i in pm.plugins(include_all=True)}
    assert infos["misspelt"].status == "failed"
    assert "unknown hook 'rlzoo_register_advantage'" in (infos["misspelt"].error or "")
    assert infos["rlzoo.algorithms.advantage"].status == "loaded"
    assert "grpo" in pm.registry("advantage")


def test_a_name_clash_from_an_entry_point_plugin_skips_it_and_rlzoo_plugins_names_it(
    add_entry_points: Callable[..., None], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before (issue 23): one installed plugin registering a name twice (or a built-in's name) made
    every command fatal, `rlzoo plugins` included."""
    add_entry_points(
        clashing="import rlzoo\n\n"
        "def fn(inputs, params):\n    '''A filter.'''\n\n"
        "@rlzoo.hookimpl\n"
        "def rlzoo_register_sample_filters(registry):\n"
        "    registry.register('twice', fn)\n"
        "    registry.register('twice', fn)\n",
        builtin_clash="import rlzoo\n\n"
        "def fn(inputs, params):\n    '''An advantage.'''\n\n"
        "@rlzoo.hookimpl\n"
        "def rlzoo_register_advantages(registry):\n"
        "    registry.register('grpo', fn)\n",
    )
    pm = PluginManager()
    with pytest.warns(PluginLoadWarning) as caught:
        infos = {i.name: i for i in pm.plugins(include_all=True)}
    said = sorted(str(w.message) for w in caught)
    assert len(said) == 2 and "'builtin_clash'" in said[0] and "'clashing'" in said[1]
    assert infos["clashing"].status == "failed"
    assert "sample_filter 'twice' is registered twice: by plugin 'clashing' and by plugin 'clashing'" in (
        infos["clashing"].error or ""
    )
    assert infos["builtin_clash"].status == "failed"
    assert "'rlzoo.algorithms.advantage'" in (infos["builtin_clash"].error or "")
    assert pm.get("advantage", "grpo").plugin == "rlzoo.algorithms.advantage"  # the built-in kept
    assert "twice" not in pm.registry("sample_filter")
    # the CLI: `rlzoo plugins --all` works and says why each was skipped; other commands too
    monkeypatch.setattr(plugins_mod, "_default", None)
    from rlzoo.cli import main

    with pytest.warns(PluginLoadWarning):
        assert main(["plugins", "--all"]) == 0
        assert main(["components", "advantage"]) == 0
    out = capsys.readouterr().out
    assert "clashing: sample_filter 'twice' is registered twice" in out


@pytest.mark.usefixtures("fake_entry_points")
def test_rlzoo_plugins_names_a_plugin_that_failed_to_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 39: `rlzoo plugins` said "no third-party plugins loaded" when one had failed to load
    from rlzoo.cli import main

    monkeypatch.setattr(plugins_mod, "_default", None)
    with pytest.warns(PluginLoadWarning):
        assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "no third-party plugins loaded" not in out
    assert "broken" in out and "failed" in out and "broken on purpose" in out  # which, and why
    assert "good" in out
