"""A plugin can implement every hook; each part lands in its kind's registry, stamped with the plugin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rlzoo
from rlzoo.kernel.commands import CliCommand
from rlzoo.kernel.kinds import KINDS
from rlzoo.kernel.plugins import PluginManager


def _part(*args, **kwargs):  # type: ignore[no-untyped-def]
    """A part of any kind."""


class EveryHook:
    """A fake plugin implementing every hook of src/rlzoo/kernel/hookspecs.py."""

    @rlzoo.hookimpl
    def rlzoo_register_advantages(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_advantage", _part)

    @rlzoo.hookimpl
    def rlzoo_register_policy_losses(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_policy_loss", _part)

    @rlzoo.hookimpl
    def rlzoo_register_loss_aggs(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_loss_agg", _part)

    @rlzoo.hookimpl
    def rlzoo_register_kls(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_kl", _part)

    @rlzoo.hookimpl
    def rlzoo_register_rollout_corrections(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_rollout_correction", _part)

    @rlzoo.hookimpl
    def rlzoo_register_sample_filters(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_sample_filter", _part)

    @rlzoo.hookimpl
    def rlzoo_register_scorers(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_scorer", _part)

    @rlzoo.hookimpl
    def rlzoo_register_reward_managers(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_reward_manager", _part)

    @rlzoo.hookimpl
    def rlzoo_register_environments(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_environment", _part)

    @rlzoo.hookimpl
    def rlzoo_register_tools(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_tool", _part)

    @rlzoo.hookimpl
    def rlzoo_register_agents(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_agent", _part)

    @rlzoo.hookimpl
    def rlzoo_register_datasets(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_dataset", _part)

    @rlzoo.hookimpl
    def rlzoo_register_train_backends(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_train_backend", _part)

    @rlzoo.hookimpl
    def rlzoo_register_rollout_backends(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_rollout_backend", _part)

    @rlzoo.hookimpl
    def rlzoo_register_runners(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_runner", _part)

    @rlzoo.hookimpl
    def rlzoo_register_loggers(self, registry):  # type: ignore[no-untyped-def]
        registry.register("every_logger", _part)

    @rlzoo.hookimpl
    def rlzoo_recipe_search_paths(self):  # type: ignore[no-untyped-def]
        return ["/nonexistent/every-hook-recipes"]

    @rlzoo.hookimpl
    def rlzoo_cli_commands(self):  # type: ignore[no-untyped-def]
        def add(parser):  # type: ignore[no-untyped-def]
            parser.add_argument("word")

        def run(ns):  # type: ignore[no-untyped-def]
            print(f"every-hook says {ns.word}")
            return 3

        return [CliCommand("every-hook", "say a word", add, run, "  rlzoo every-hook hello")]


@pytest.fixture
def every_hook(pm: PluginManager) -> Iterator[PluginManager]:
    pm.register(EveryHook(), "every_hook")
    yield pm
    pm.unregister("every_hook")


@pytest.mark.parametrize("kind", [k.name for k in KINDS])
def test_register_hook_of_each_kind(every_hook: PluginManager, kind: str) -> None:
    comp = every_hook.get(kind, f"every_{kind}")
    assert comp.plugin == "every_hook" and comp.kind == kind and comp.summary == "A part of any kind."


def test_recipe_search_paths_hook(every_hook: PluginManager) -> None:
    from rlzoo.recipe.files import recipe_search_paths

    paths = [str(p) for p in recipe_search_paths(every_hook)]
    assert "/nonexistent/every-hook-recipes" in paths
    assert paths.index("/nonexistent/every-hook-recipes") > 0  # after the working directory


def test_plugin_lists_every_hook(every_hook: PluginManager) -> None:
    info = {i.name: i for i in every_hook.plugins()}["every_hook"]
    assert len(info.hooks) == len(KINDS) + 2


def test_cli_commands_hook(
    every_hook: PluginManager, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin's command is an ``rlzoo`` subcommand: its arguments, its exit code, its examples."""
    from rlzoo import cli
    from rlzoo.kernel import plugins as plugins_mod

    monkeypatch.setattr(plugins_mod, "_default", every_hook)
    assert cli.main(["every-hook", "hello"]) == 3
    assert "every-hook says hello" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["every-hook", "--help"])
    assert "rlzoo every-hook hello" in capsys.readouterr().out


def test_a_plugin_command_cannot_take_a_builtin_name(
    pm: PluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlzoo import cli
    from rlzoo.kernel import plugins as plugins_mod

    class Shadow:
        @rlzoo.hookimpl
        def rlzoo_cli_commands(self):  # type: ignore[no-untyped-def]
            return [CliCommand("train", "not the real train", lambda p: None, lambda ns: 0)]

    pm.register(Shadow(), "shadow")
    monkeypatch.setattr(plugins_mod, "_default", pm)
    with pytest.raises(rlzoo.RlzooError, match="'train' is already an rlzoo command"):
        cli.build_parser()
