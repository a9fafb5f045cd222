"""The example third-party plugin: discovered by entry point, listed, selectable, blockable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from plugin_fixtures import EXAMPLE_DIST, MINIMAL_RECIPE

from rlzoo.cli import main
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.config import bind_config
from rlzoo.recipe.files import list_recipes

pytestmark = pytest.mark.usefixtures("example")


def test_discovered_through_its_entry_point(pm: PluginManager) -> None:
    info = {i.name: i for i in pm.plugins()}["example"]
    assert info.distribution == EXAMPLE_DIST and info.source == f"entry point rlzoo:example ({EXAMPLE_DIST})"
    assert info.hooks == ["rlzoo_recipe_search_paths", "rlzoo_register_advantages", "rlzoo_register_scorers"]
    assert info.parts == ["advantage:example_rloo", "scorer:example_keyword"]
    comp = pm.get("advantage", "example_rloo")
    assert comp.plugin == "example" and comp.capability("needs_group") is True
    assert comp.target == "rlzoo_example.advantage:example_rloo"  # lazy: listing imports no torch


def test_listed_by_the_cli(default_pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    plugins = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in plugins if p["distribution"] == EXAMPLE_DIST] == ["example"]
    assert main(["components", "advantage", "--json"]) == 0
    comps = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert comps["example_rloo"]["plugin"] == "example"
    assert comps["example_rloo"]["summary"].startswith("REINFORCE leave-one-out")
    assert {p["name"] for p in comps["example_rloo"]["params"]} == {"baseline_weight", "clip"}


def test_selectable_by_name_in_a_recipe(pm: PluginManager) -> None:
    raw = {**MINIMAL_RECIPE, "algorithm": {"advantage": {"name": "example_rloo", "clip": 2.0}}}
    cfg = bind_config(raw, pm)
    sel = cfg.algorithm.advantage
    assert sel.name == "example_rloo" and sel.component.plugin == "example" and sel.params.clip == 2.0
    assert "rlzoo_example.advantage" not in sys.modules or sel.fn  # binding does not need the impl


def test_params_validated_like_any_part(pm: PluginManager) -> None:
    raw = {**MINIMAL_RECIPE, "algorithm": {"advantage": {"name": "example_rloo", "clip": -1.0, "bias": 1}}}
    with pytest.raises(ConfigError) as e:
        bind_config(raw, pm)
    text = str(e.value)
    assert "algorithm.advantage.bias: unknown key for advantage 'example_rloo'" in text
    assert "clip must be positive" in text


def test_recipe_from_the_plugin_search_path(
    default_pm: PluginManager, capsys: pytest.CaptureFixture[str]
) -> None:
    recipes = list_recipes(default_pm)
    assert recipes["example_quickstart"].parent.name == "recipes"
    assert "rlzoo_example" in str(recipes["example_quickstart"])
    if "quickstart" not in recipes:
        pytest.skip("src/rlzoo/recipes/quickstart.yaml is not there yet (example_quickstart extends it)")
    assert main(["validate", "example_quickstart"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("algorithm.advantage "))
    assert row.split()[1:] == ["advantage", "example_rloo", "example"]


def test_blocked_by_the_allow_list_then_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLZOO_PLUGINS", "")
    pm = PluginManager()
    assert {i.name: i.status for i in pm.plugins(include_all=True)}["example"] == "blocked"
    assert "example_rloo" not in pm.registry("advantage")
    assert "example_quickstart" not in list_recipes(pm)
    raw = {**MINIMAL_RECIPE, "algorithm": {"advantage": "example_rloo"}}
    with pytest.raises(ConfigError) as e:
        bind_config(raw, pm)
    assert "algorithm.advantage.name: unknown advantage 'example_rloo'" in str(e.value)


def test_recipe_file_ships_with_the_package() -> None:
    import rlzoo_example.plugin as plugin

    assert (Path(plugin.RECIPES_DIR) / "example_quickstart.yaml").is_file()
