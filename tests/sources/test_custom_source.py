"""A third-party runner is one small class: a batch source registered by a plugin, fed to the core's loop.

The source below generates the step's prompts once (no filter, no refill) and collates them with the
session's helpers. On the quickstart recipe (no sample filter, no greedy baseline) that is exactly
what ``sync`` trains on, so the two runs must produce the same updates, step for step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import build

import rlzoo
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.metrics import read_metrics
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.loop import BatchSource, StepTimer
from rlzoo.train.session import Session


@dataclass(frozen=True)
class GenerateOnceParams:
    """Generate the step's prompts once, score them, train on all of them (no filter, no refill)."""


class GenerateOnce:
    """The whole runner: where batches come from (the loop owns everything else)."""

    def __init__(self, params: GenerateOnceParams, session: Session) -> None:
        self.s = session
        self.loader = session.make_loader(session.plan.prompts_per_step)
        self.responses = 0

    def resume(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])

    def next_batch(self, step: int, timer: StepTimer) -> Batch | None:
        with timer.wait("gen"):  # the trainer waits for the generation
            samples = self.s.rollout.generate(self.s.train_requests(next(self.loader), step, 1))
        results = self.s.score(samples)
        return samples_to_batch(
            samples, results, self.s.pad_token_id, max_response_length=self.s.data.max_response_length
        )

    def push_weights(self, timer: StepTimer) -> dict[str, float]:
        return self.s.sync_weights()

    def step_done(self, batch: Batch | None) -> dict[str, float]:
        self.responses += len(batch) if batch is not None else 0
        return {"generate_once/responses": float(self.responses)}

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict()}


class GenerateOncePlugin:
    @rlzoo.hookimpl
    def rlzoo_register_runners(self, registry: Any) -> None:
        registry.register("generate_once", GenerateOnce, params=GenerateOnceParams, capabilities={})


@pytest.fixture
def with_plugin(pm: PluginManager) -> Iterator[PluginManager]:
    pm.register(GenerateOncePlugin(), "generate_once_plugin")
    yield pm
    pm.unregister(name="generate_once_plugin")


def test_the_source_class_satisfies_the_protocol() -> None:
    source: type[BatchSource] = GenerateOnce  # mypy checks the members' signatures here
    assert source is GenerateOnce


def test_a_plugin_source_trains_like_sync(
    with_plugin: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    common = ["trainer.total_steps=2", "trainer.save_freq=2", "trainer.test_freq=-1"]
    sync = build(with_plugin, "quickstart", quickstart_dir, tmp_path / "sync", *common).train()
    mine = build(
        with_plugin, "quickstart", quickstart_dir, tmp_path / "mine", "runner=generate_once", *common
    ).train()
    assert mine["runner"] == "generate_once" and mine["last_step"] == 2
    a, b = read_metrics(Path(sync["run_dir"])), read_metrics(Path(mine["run_dir"]))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    prompts, n = 16, 16  # src/rlzoo/recipes/quickstart.yaml: data.train_batch_size, rollout.n
    assert [r["generate_once/responses"] for r in b] == [prompts * n, 2 * prompts * n]
    for ra, rb in zip(a, b):
        for k in ("critic/rewards/mean", "critic/advantages/max", "actor/pg_loss", "actor/grad_norm"):
            assert rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-7), (ra["step"], k)
        # issue 39: the batch's own metrics come from the loop, so a runner written like this one
        # (docs/runners.md) keeps them; it used to lose critic/score/*, reward/failed and agent/*
        for k in ("critic/score/mean", "critic/score/max", "reward/failed", "reward/failed_frac"):
            assert k in rb and rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-7), (ra["step"], k)
    # the loop wrote the one checkpoint payload, with the source's state in it
    (saved,) = (Path(mine["run_dir"]) / "checkpoints").glob("*/rlzoo_checkpoint.json")
    payload = json.loads(saved.read_text())["payload"]
    assert payload["runner"] == "generate_once" and payload["step"] == 2
    assert payload["data"]["loader"]["position"] == 2 * prompts
