"""Every shipped recipe validates; each has a tiny variant that runs end to end on the CPU.

The tiny variants (``src/rlzoo/recipes/tiny/<name>.yaml``, composed as ``+tiny=<name>``) keep the recipe's
algorithm and swap the scale: a tiny Qwen2 built from a config, a few rows in the *upstream*
layout run through the real preparer, native backends, 3 steps with validation at steps 0, 2, 3.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlzoo.models.tiny import build_tiny, tiny_inputs
from rlzoo.recipe.config import load_config
from rlzoo.recipe.files import list_recipes
from rlzoo.recipe.types import RecipeConfig

RECIPES_DIR = Path(__file__).resolve().parents[2] / "src" / "rlzoo" / "recipes"
ALL_RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("[!_]*.yaml"))  # _name.yaml: pieces, not recipes
SEED_RECIPES = ("dapo_math", "grpo_geo3k_vl", "ppo_gsm8k", "grpo_gsm8k")


def _name(sel: Any) -> str | None:
    return None if sel is None else sel.name


def _parts(cfg: RecipeConfig) -> dict[str, Any]:
    """The algorithm-defining parts of a recipe (what a tiny variant must keep)."""
    alg = cfg.algorithm
    return {
        "advantage": _name(alg.advantage),
        "policy_loss": (_name(alg.policy_loss), alg.policy_loss.params),
        "loss_agg": _name(alg.loss_agg),
        "use_kl_loss": alg.use_kl_loss,
        "kl_loss": (_name(alg.kl_loss), alg.kl_loss_coef) if alg.use_kl_loss else None,
        "use_kl_in_reward": alg.use_kl_in_reward,
        "sample_filter": _name(alg.sample_filter),
        "reward_manager": _name(cfg.reward.manager),
        "scorer": _name(cfg.reward.scorer),
        "runner": _name(cfg.runner),
        "data.prepare": _name(cfg.data.prepare),
        "val_before_train": cfg.trainer.val_before_train,
    }


# ---------------------------------------------------------------------------------------------
# every recipe
# ---------------------------------------------------------------------------------------------
def test_seed_recipes_are_shipped() -> None:
    assert set(SEED_RECIPES) <= set(ALL_RECIPES)
    assert set(SEED_RECIPES) <= set(list_recipes())  # found by name on the search path
    assert set(tiny_inputs()) == set(SEED_RECIPES)
    assert {p.stem for p in (RECIPES_DIR / "tiny").glob("[!_]*.yaml")} == set(SEED_RECIPES)


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_every_recipe_validates(recipe: str) -> None:
    cfg = load_config(recipe)  # binds every section and part; raises one ConfigError listing all
    assert cfg.recipe == recipe


@pytest.mark.parametrize("recipe", [*SEED_RECIPES, "quickstart"])
def test_recipe_opens_with_its_command_and_hardware(recipe: str) -> None:
    lines = (RECIPES_DIR / f"{recipe}.yaml").read_text().splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    text = "\n".join(header)
    assert "rlzoo train" in text and (f"rlzoo train {recipe}" in text or recipe == "quickstart"), text
    assert "Hardware:" in text, f"{recipe}.yaml: the header must say what hardware it expects"


# ---------------------------------------------------------------------------------------------
# the seed's knobs (SEED-NOTES.md): the recipes say what the seed ran
# ---------------------------------------------------------------------------------------------
def test_dapo_math_has_the_seed_dapo_knobs() -> None:
    cfg = load_config("dapo_math")
    assert cfg.model.path == "Qwen/Qwen2.5-Math-7B"
    assert _name(cfg.algorithm.advantage) == "grpo"
    pl = cfg.algorithm.policy_loss.params
    assert (pl.clip_ratio_low, pl.clip_ratio_high) == (0.2, 0.28)
    assert cfg.algorithm.use_kl_loss is False and cfg.algorithm.use_kl_in_reward is False
    assert _name(cfg.algorithm.loss_agg) == "token-mean"
    mgr = cfg.reward.manager
    assert mgr.name == "dapo"
    assert (mgr.params.overlong_buffer_len, mgr.params.penalty_factor, mgr.params.max_response_length) == (
        4096,
        1.0,
        8192,
    )
    assert cfg.data.max_response_length == 8192 and cfg.data.max_prompt_length == 2048
    assert _name(cfg.algorithm.sample_filter) == "dynamic_sampling"
    assert cfg.rollout.n == 16 and cfg.trainer.ppo_mini_batch_size == 32
    assert cfg.trainer.val_before_train
    assert any("aime2024" in f for f in cfg.data.val_files)
    assert _name(cfg.data.prepare) == "dapo_math"
    p = cfg.placement
    assert (p.name, p.colocate, p.trainer.n_gpus_per_node, p.rollout.n_gpus_per_node) == ("ray", False, 4, 4)
    assert _name(cfg.trainer.backend) == "fsdp2" and cfg.trainer.backend.params.fsdp_size == 2
    assert cfg.trainer.backend.params.ref_offload and cfg.trainer.backend.params.use_remove_padding


def test_dapo_math_overlong_limit_follows_the_response_limit() -> None:
    cfg = load_config(
        "dapo_math", ["data.max_response_length=4096", "reward.manager.overlong_buffer_len=1024"]
    )
    assert cfg.reward.manager.params.max_response_length == 4096


def test_grpo_geo3k_vl_has_the_seed_grpo_knobs() -> None:
    cfg = load_config("grpo_geo3k_vl")
    assert cfg.model.path == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert _name(cfg.algorithm.advantage) == "grpo"
    assert cfg.algorithm.use_kl_loss and cfg.algorithm.kl_loss_coef == 0.01
    assert _name(cfg.algorithm.kl_loss) == "k3"  # low_var_kl is k3's alias
    assert cfg.rollout.n == 4 and cfg.trainer.ppo_mini_batch_size == 128
    assert _name(cfg.data.prepare) == "geometry3k" and _name(cfg.reward.scorer) == "geo3k"
    p = cfg.placement
    assert (p.name, p.colocate, p.trainer.n_gpus_per_node, p.rollout.n_gpus_per_node) == ("ray", False, 4, 4)


def test_ppo_gsm8k_trains_a_critic_colocated() -> None:
    cfg = load_config("ppo_gsm8k")
    assert _name(cfg.algorithm.advantage) == "gae"
    assert cfg.algorithm.advantage.capability("needs_critic")
    assert cfg.rollout.n == 1
    assert cfg.placement.colocate and _name(cfg.trainer.backend) == "fsdp2"
    assert _name(cfg.reward.scorer) == "gsm8k"


def test_grpo_gsm8k_is_the_sync_grpo_baseline() -> None:
    cfg = load_config("grpo_gsm8k")
    assert _name(cfg.algorithm.advantage) == "grpo"
    assert cfg.rollout.n >= 2 and _name(cfg.runner) == "sync" and cfg.placement.colocate


@pytest.mark.parametrize("recipe", ["grpo_smollm2_arith", "distill_smollm2_arith"])
def test_smollm2_arith_pays_for_the_sum_not_for_restating_the_question(recipe: str) -> None:
    # the scorer was math-verify, which read "To find 24 + 22, ..." as the expression 24 + 22 = 46
    scorer = load_config(recipe).reward.scorer

    def score(text: str) -> float:
        r = scorer(text, "46", "smollm2_arith", {})
        return float(r["score"] if isinstance(r, dict) else r)

    for right in ("46", "24 + 22 = 46", "The answer is 46.", "\\boxed{46}"):
        assert score(right) == 1.0, right
    for wrong in ("To find 24 + 22, we need to add the two numbers.", "What is 24 + 22?", "45"):
        assert score(wrong) == 0.0, wrong


@pytest.mark.parametrize("recipe", ["grpo_smollm2_arith", "grpo_smollm2_count"])
def test_smollm2_recipes_update_padding_free_with_shared_prompts(recipe: str) -> None:
    # measured fastest (docs/performance.md): each group's prompt once in the packed row
    cfg = load_config(recipe)
    assert _name(cfg.trainer.backend) == "native" and cfg.trainer.backend.params.use_remove_padding
    assert cfg.rollout.n > 1  # a group's answers to share the prompt


# ---------------------------------------------------------------------------------------------
# tiny variants
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", SEED_RECIPES)
def test_tiny_variant_keeps_the_algorithm_and_swaps_the_scale(recipe: str, tiny_env: Path) -> None:
    full = load_config(recipe)
    tiny = load_config(recipe, [f"+tiny={recipe}"])
    assert _parts(tiny) == _parts(full)
    assert _name(tiny.trainer.backend) == "native" and _name(tiny.rollout.backend) == "native"
    assert tiny.placement.name == "local" and tiny.model.device == "cpu"
    assert tiny.model.path == str(tiny_env / recipe / "model")
    assert tiny.trainer.total_steps == 3
    assert tiny.data.prepare.params.source.startswith(str(tiny_env / recipe / "upstream"))


def test_command_line_overrides_win_over_the_tiny_set(tiny_env: Path) -> None:
    cfg = load_config("dapo_math", ["+tiny=dapo_math", "trainer.total_steps=2", "rollout.n=2"])
    assert cfg.trainer.total_steps == 2 and cfg.rollout.n == 2
    # the tiny set's own overlong buffer follows the tiny response limit
    assert cfg.reward.manager.params.max_response_length == cfg.data.max_response_length == 8


def _records(run_dir: Path) -> dict[int, dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


#: recipe -> (validation data source, val n)
VAL = {
    "dapo_math": ("math_dapo", 4),
    "grpo_gsm8k": ("openai/gsm8k", 1),
    "ppo_gsm8k": ("openai/gsm8k", 1),
    "grpo_geo3k_vl": ("hiyouga/geometry3k", 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", SEED_RECIPES)
def test_tiny_variant_runs_end_to_end(recipe: str, tiny_env: Path, tmp_path: Path) -> None:
    from rlzoo.recipe.compose import build_run

    base = build_tiny(recipe, tiny_env)
    assert not (base / "train.parquet").exists()  # the recipe's data.prepare writes it
    run_dir = tmp_path / "run"
    summary = build_run(recipe, [f"+tiny={recipe}", f"run.output_dir={run_dir}"]).train()
    assert summary["steps"] == 3
    assert (base / "train.parquet").exists()
    for f in ("config.yaml", "plugins.json", "metrics.jsonl", "summary.json"):
        assert (run_dir / f).exists(), f
    recs = _records(run_dir)
    assert sorted(recs) == [0, 1, 2, 3]
    source, n = VAL[recipe]
    val_keys = [f"val/{source}/mean@{n}", f"val/{source}/best@{n}", f"val/{source}/maj@{n}", "val/mean"]
    # validation: before training (step 0), at test_freq=2, and at the last step; not at step 1
    for step in (0, 2, 3):
        for k in val_keys:
            assert isinstance(recs[step].get(k), float) and 0.0 <= recs[step][k] <= 1.0, (step, k)
    assert not any(k.startswith("val/") for k in recs[1])
    # training metrics are in the same records as the validation ones
    for step in (1, 2, 3):
        r = recs[step]
        for k in (
            "critic/score/mean",
            "response_length/mean",
            "response_length/clip_ratio",
            "actor/pg_loss",
            "timing_s/step",
            "perf/throughput",
        ):
            assert isinstance(r.get(k), float), (step, k)
        assert r["response_length/max"] <= 8
    if recipe == "ppo_gsm8k":
        assert "critic/vf_loss" in recs[1] or any(k.startswith("critic/v") for k in recs[1])
    if recipe in ("grpo_gsm8k", "grpo_geo3k_vl"):
        assert "actor/kl_loss" in recs[1]
    if recipe == "dapo_math":
        assert recs[1]["rollout/gen_rounds"] >= 1.0
    # the report renders from what the run wrote
    from rlzoo.report import plot_run

    files = plot_run(run_dir)
    names = {p.name for p in files}
    assert {"overview.png", "reward.png", "validation.png", "response_length.png", "summary.md"} <= names
