"""The session is built from a frozen, typed ``RunInputs`` and holds no recipe: a few typed records,
the backends, the trainer and the run directory's writers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from run_fixtures import build

from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.types import RecipeConfig
from rlzoo.train.inputs import RunInputs, run_inputs

#: at most this many attributes on a built session (issue 32: it had 33, the recipe among them)
MAX_ATTRIBUTES = 15


def test_a_built_session_is_small_and_holds_no_recipe(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    loop = build(pm, "quickstart", quickstart_dir, tmp_path / "run", "trainer.total_steps=1").loop()
    s = loop.s
    try:
        attrs = vars(s)
        assert len(attrs) <= MAX_ATTRIBUTES, sorted(attrs)
        assert not [k for k, v in attrs.items() if isinstance(v, RecipeConfig)]
        # nor one level down, in its records
        records = [v for v in attrs.values() if dataclasses.is_dataclass(v) and not isinstance(v, type)]
        assert records, "the session groups what it holds into typed records"
        for rec in records:
            for f in dataclasses.fields(rec):
                assert not isinstance(getattr(rec, f.name), RecipeConfig), (type(rec).__name__, f.name)
        # the runner API of docs/runners.md
        assert s.plan.prompts_per_step == 16  # src/rlzoo/recipes/quickstart.yaml: data.train_batch_size
        assert s.rollout is s.backends.engine  # single-turn: the sources generate on the engine itself
        assert s.pad_token_id == s.data.pad_token_id and s.start_step == 0 and s.resumed is None
        assert s.schedule.total_steps == 1
    finally:
        s.close()


def test_run_inputs_are_frozen_and_read_once(pm: PluginManager, quickstart_dir: Path, tmp_path: Path) -> None:
    run = build(pm, "quickstart", quickstart_dir, tmp_path / "run", "trainer.total_steps=3")
    inputs = run_inputs(run.config)
    assert isinstance(inputs, RunInputs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.schedule = inputs.schedule  # type: ignore[misc]
    assert inputs.schedule.total_steps == 3 and inputs.sampling.train.seed is None
    assert inputs.backends.agent is None  # quickstart is single-turn


def test_chat_template_arguments_reach_the_prompts_and_the_turns(tmp_path: Path) -> None:
    import rlzoo

    run = rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            "trainer.total_steps=1",
            "data.chat_template_kwargs={enable_thinking: false}",
        ],
    )
    s = run.loop().s
    try:
        assert s.data.chat_template_kwargs == {"enable_thinking": False}
        assert s.data.train.chat_template_kwargs == {"enable_thinking": False}  # the prompts
        assert s.rollout.template_kwargs == {"enable_thinking": False}  # the multi-turn turns
    finally:
        s.close()
