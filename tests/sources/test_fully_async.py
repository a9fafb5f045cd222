"""The fully-async runner: equivalence with sync, prompt accounting across syncs and resume,
crash propagation, knob validation."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import build, overrides

import rlzoo
from rlzoo.backends.simulated import SimulatedRolloutParams, SimulatedTrainParams
from rlzoo.backends.simulated.backend import SimulatedRolloutBackend, SimulatedTrainBackend
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.compose import _selection_for
from rlzoo.recipe.config import load_config
from rlzoo.report.metrics import read_metrics
from rlzoo.sources.params import FullyAsyncParams
from rlzoo.sources.queue import RolloutFailed
from rlzoo.testing.runs import SIMULATED_BACKENDS

from .recording import assert_identical, recorded_run


@pytest.mark.parametrize("early_push", [False, True])
def test_zero_staleness_equals_sync_bit_for_bit(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path, early_push: bool
) -> None:
    """Issue 38: staleness 0 and a push every step is sync, to the bit on the native backends: the
    same batches (prompt ids, response ids, rollout log-probs, rewards), the same losses, the same
    final weights. Responses of up to 12 tokens and 64 engine slots for 256 sequences a step, so
    sequences of different lengths join and leave the engine's batch (continuous batching).
    With ``early_push`` (the push on a thread) too: it pushes the updated weights, not older ones."""
    common = [
        "trainer.total_steps=3",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "data.max_response_length=12",
        "rollout.backend.max_num_seqs=64",
    ]
    # the same 16 prompts per step in 2 mini-batches of 8 on both sides (sync: train_batch_size=16)
    on_policy = [
        "runner.staleness_threshold=0",
        "runner.trigger_parameter_sync_step=1",
        "runner.require_batches=2",
        "runner.partial_rollout=true",  # nothing is in flight at a push: false is the same
        f"runner.early_push={str(early_push).lower()}",
    ]
    sync = recorded_run(pm, "quickstart", quickstart_dir, tmp_path / "sync", *common)
    fa = recorded_run(pm, "quickstart_async", quickstart_dir, tmp_path / "fa", *common, *on_policy)
    assert_identical(sync, fa, 3)
    lengths = sync[0][0]["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()  # responses of several lengths
    recs = read_metrics(tmp_path / "fa")
    assert all(r["staleness/max"] == 0.0 and r["rollout/partial_ratio"] == 0.0 for r in recs)
    assert "rollout_corr/kl" in recs[-1]  # rollout / trainer mismatch metrics are logged


def test_a_checkpoint_keeps_each_outstanding_prompts_attempt() -> None:
    """A prompt whose group was dropped as too stale is generated again as a new attempt (new
    seeds). Before: the checkpoint kept only (epoch, index, batch, position), so a resume generated
    a regenerating prompt with its first attempt's seeds again: the very response that had been too
    long to survive, where the uninterrupted run drew a new one."""
    from rlzoo.data.dataset import PromptLoader
    from rlzoo.sources.fully_async import Prompt, PromptSource

    data = [{"prompt_ids": [i + 1]} for i in range(8)]

    def source() -> PromptSource:
        return PromptSource(data, PromptLoader(data, batch_size=4, seed=3), lambda p: p, limit=None)

    first = source()
    a, b, c = first.draw(), first.draw(), first.draw()
    assert a is not None and b is not None and c is not None
    first.dropped(a)  # dropped, waiting for regeneration
    first.dropped(b)
    first.dropped(b)  # dropped twice
    first.trained([c])
    state = first.state_dict()
    resumed = source()
    resumed.load_state_dict(state)
    again: list[Prompt] = []
    while (p := resumed.draw()) is not None and len(again) < 5:
        again.append(p)
    assert [(p.key, p.batch_no, p.j, p.attempt) for p in again[:2]] == [
        (a.key, a.batch_no, a.j, 2),
        (b.key, b.batch_no, b.j, 3),
    ]
    # then the rest of the loader batch (its 4th prompt), then the next batch; c is not drawn again
    assert [p.attempt for p in again[2:]] == [1, 1, 1]
    assert c.key not in [p.key for p in again]
    assert [p.j for p in again[2:]] == [3, 0, 1] and [p.batch_no for p in again[2:]] == [1, 2, 2]


def _sim_run(pm: PluginManager, quickstart_dir: Path, run_dir: Path, *extra: str, **objects: Any) -> Any:
    return build(
        pm,
        "quickstart_async",
        quickstart_dir,
        run_dir,
        *SIMULATED_BACKENDS,
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        *extra,
        **objects,
    )


def test_no_prompt_lost_or_trained_twice_across_syncs_and_resume(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    knobs = [
        "runner.staleness_threshold=0.5",
        "runner.trigger_parameter_sync_step=1",
        "runner.partial_rollout=true",
    ]
    out = tmp_path / "run"
    run1 = _sim_run(pm, quickstart_dir, out, *knobs, "trainer.total_steps=4")
    r1 = run1.loop()
    r1.run()
    trained1 = list(r1.source.prompts.trained_keys)
    assert len(trained1) == 4 * 16
    run2 = _sim_run(pm, quickstart_dir, out, *knobs, "trainer.total_steps=8", "resume=true")
    r2 = run2.loop()
    r2.run()
    trained = trained1 + list(r2.source.prompts.trained_keys)
    assert len(trained) == 8 * 16 and len(set(trained)) == len(trained)  # nothing trained twice
    # nothing lost: trained + still outstanding at the end == a prefix of the loader's epoch-0 order
    st = r2.source.prompts.state_dict()
    left = [(e, i) for e, i, *_ in st["pending"] + st["buffer"]]
    order = r2.source.prompts.loader.order(0)
    assert sorted(trained + left) == sorted((0, i) for i in order[: len(trained) + len(left)])
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == list(range(1, 9))
    assert max(r["staleness/max"] for r in recs) <= 1
    assert recs[-1]["rollouter/samples_collected"] > 0 and "queue/size" in recs[-1]


@pytest.mark.parametrize("early_push", [False, True])
def test_partial_rollout_spans_versions_and_bound_holds(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path, early_push: bool
) -> None:
    """Long responses across weight pushes: tokens from several versions, staleness <= ceil(s)."""
    run = _sim_run(
        pm,
        quickstart_dir,
        tmp_path / "run",
        f"runner.early_push={str(early_push).lower()}",
        "rollout.backend.mean_response_length=12",
        "rollout.backend.decode_step_s=0.002",
        "rollout.backend.sigma=2.0",
        "data.max_response_length=256",
        "runner.staleness_threshold=0.5",
        "runner.trigger_parameter_sync_step=1",
        "runner.require_batches=1",
        "trainer.ppo_mini_batch_size=4",
        "trainer.total_steps=10",
    )
    runner = run.loop()
    summary = runner.run()
    recs = read_metrics(Path(summary["run_dir"]))
    assert max(r["staleness/max"] for r in recs) <= 1
    assert max(r["rollout/partial_ratio"] for r in recs) > 0  # some samples span a push
    assert max(r["rollout/version_span/max"] for r in recs) >= 1
    assert all(set(k) <= {"0", "1"} for k in [summary["staleness_histogram"]])
    assert all(0.0 <= r["trainer/idle_ratio"] <= 1.0 for r in recs)
    # long responses outlive two pushes: dropped as too stale, regenerated, never trained twice
    assert recs[-1]["rollouter/dropped_samples"] > 0
    assert len(set(runner.source.prompts.trained_keys)) == len(runner.source.prompts.trained_keys) == 10 * 4


class _RecordingRollout(SimulatedRolloutBackend):
    """Records each push: (the version it is labelled with, the trainer version its weights hold)."""

    pushes: list[tuple[int, int]] = []

    def update_weights(self, named_tensors: Any, version: int) -> None:
        held = [int(t.item()) for name, t in named_tensors if name == "version"]
        type(self).pushes.append((int(version), held[0]))
        super().update_weights([], version)


@pytest.mark.parametrize("partial", [True, False])
def test_early_push_pushes_the_updated_weights_under_their_version(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path, partial: bool
) -> None:
    """runner.early_push overlaps the push with the step's tail; what reaches the rollout is what a
    push after the update sends: the weights after the window's last update (the simulated trainer's
    version counts its optimizer steps: one per mini-batch, here R = 2 a step), labelled with that
    version. A push of the weights before the window's last update (the benchmark's old experiment)
    would hold and be labelled 2 updates fewer. Every sample's tokens: staleness <= ceil(s) = 1."""
    part = rlzoo.part(
        _RecordingRollout,
        params=SimulatedRolloutParams(decode_step_s=0.001, mean_response_length=8, sigma=1.5),
        capabilities={"supports_partial_rollout": True, "supports_streaming": True},
    )
    pushes = {}
    for early in (False, True):
        _RecordingRollout.pushes = []
        run = _sim_run(
            pm,
            quickstart_dir,
            tmp_path / f"run{early}",
            "runner.staleness_threshold=0.5",
            "runner.trigger_parameter_sync_step=2",
            "runner.require_batches=2",
            f"runner.partial_rollout={str(partial).lower()}",
            f"runner.early_push={str(early).lower()}",
            "trainer.ppo_mini_batch_size=4",
            "data.max_response_length=64",
            "trainer.total_steps=6",
            rollout_backend=part,
        )
        summary = run.loop().run()
        pushes[early] = list(_RecordingRollout.pushes)
        recs = read_metrics(Path(summary["run_dir"]))
        assert [r["param_version"] for r in recs] == [0, 1, 1, 2, 2, 3]  # a push every K = 2 steps
        assert max(r["staleness/max"] for r in recs) <= 1
        assert set(summary["staleness_histogram"]) <= {"0", "1"}
    # after steps 2, 4, 6 (K = 2), with 2 updates a step: the weights of update 4, 8, 12
    assert pushes[True] == pushes[False] == [(4, 4), (8, 8), (12, 12)]


class _CrashingRollout(SimulatedRolloutBackend):
    """Fails in its engine thread after 20 samples."""

    def _sample(self, s: Any, n_tokens: int, reason: str) -> Any:
        self.count = getattr(self, "count", 0) + 1
        if self.count > 20:
            raise RuntimeError("decode kernel fault (simulated)")
        return super()._sample(s, n_tokens, reason)


class _CrashingTrainer(SimulatedTrainBackend):
    def update_policy(self, mini_batch: Any, objective: Any) -> dict[str, float]:
        if self.version >= 2:
            raise FloatingPointError("loss is NaN (simulated)")
        return super().update_policy(mini_batch, objective)


def test_rollouter_crash_stops_the_trainer(pm: PluginManager, quickstart_dir: Path, tmp_path: Path) -> None:
    part = rlzoo.part(
        _CrashingRollout,
        params=SimulatedRolloutParams(decode_step_s=0.001, mean_response_length=6),
        capabilities={"supports_partial_rollout": True, "supports_streaming": True},
    )
    run = _sim_run(pm, quickstart_dir, tmp_path / "run", "trainer.total_steps=50", rollout_backend=part)
    t0 = time.monotonic()
    with pytest.raises(RolloutFailed) as info:
        run.train()
    assert time.monotonic() - t0 < 60
    assert "decode kernel fault" in repr(
        info.value.__cause__.__cause__
    )  # engine error -> rollouter -> trainer
    assert not [t for t in threading.enumerate() if t.name == "rlzoo-rollouter" and t.is_alive()]


def test_trainer_crash_stops_the_rollouter(pm: PluginManager, quickstart_dir: Path, tmp_path: Path) -> None:
    part = rlzoo.part(_CrashingTrainer, params=SimulatedTrainParams(update_s_per_token=1e-6), capabilities={})
    run = _sim_run(pm, quickstart_dir, tmp_path / "run", "trainer.total_steps=50", train_backend=part)
    runner = run.loop()
    with pytest.raises(FloatingPointError):
        runner.run()
    runner.source.rollouter.join(timeout=10)
    assert not runner.source.rollouter.thread.is_alive()
    assert runner.source.queue.stopped


def _cfg(pm: PluginManager, quickstart_dir: Path, *extra: str) -> Any:
    return load_config("quickstart_async", [f"data.dir={quickstart_dir}", *extra], pm)


def test_knob_validation_names_the_knobs(pm: PluginManager, quickstart_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(
            pm,
            quickstart_dir,
            "runner.trigger_parameter_sync_step=0",
            "runner.max_queue_size=4",
            "runner.require_batches=300",
            "runner.total_rollout_steps=100",
            "trainer.total_steps=7",
        )
    text = str(info.value)
    assert "runner.trigger_parameter_sync_step: must be >= 1" in text
    assert "runner.max_queue_size: 4 groups is smaller than one trainer step" in text
    assert "runner.total_rollout_steps: 100 prompts is less than one trainer step" in text
    assert "data.train_files hold only" in text and "runner.require_batches: 300" in text
    with pytest.raises(
        ConfigError, match=r"trainer.total_steps: 7 disagrees with runner.total_rollout_steps=320"
    ):
        _cfg(pm, quickstart_dir, "runner.total_rollout_steps=320", "trainer.total_steps=7")
    cfg = _cfg(pm, quickstart_dir)
    assert FullyAsyncParams.check(cfg.runner.params, cfg) == []
    # a rollout backend that cannot pause / stream
    cfg.rollout.backend = _selection_for(
        "rollout_backend", "rollout.backend", rlzoo.part(object, capabilities={})
    )
    problems = FullyAsyncParams.check(cfg.runner.params, cfg)
    assert any(p.startswith("runner.partial_rollout:") and "supports_partial_rollout" in p for p in problems)
    assert any("supports_streaming" in p for p in problems)
    no_partial = dataclasses.replace(cfg.runner.params, partial_rollout=False)
    assert not any("partial_rollout" in p for p in FullyAsyncParams.check(no_partial, cfg))


def test_total_rollout_steps_sets_the_trainer_steps(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    # 50 prompts // (2 x 8 per step) = 3 steps; 50 - 48 drawn prompts are left untrained
    summary = _sim_run(
        pm, quickstart_dir, tmp_path / "run", "runner.total_rollout_steps=50", "trainer.total_steps=null"
    ).train()
    recs = read_metrics(Path(summary["run_dir"]))
    assert summary["steps"] == 3 and [r["step"] for r in recs] == [1, 2, 3]


def test_overrides_helper_is_stable(quickstart_dir: Path, tmp_path: Path) -> None:
    assert overrides(quickstart_dir, tmp_path)[0] == f"data.dir={quickstart_dir}"


def test_generation_goes_on_while_a_slow_scorer_runs(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    """Issue 36: the Rollouter used to score each chunk itself, so generation stopped while a scorer
    ran (code in a sandbox). With the engine driven by the Rollouter's own stream (no engine thread),
    an engine step that starts while a scorer call is running proves the overlap; before, there
    was none (the same thread did both)."""
    calls: list[tuple[float, float]] = []

    def slow(response: str, ground_truth: Any, data_source: str, extra_info: Any, params: Any) -> float:
        t0 = time.monotonic()
        time.sleep(0.01)  # a sandboxed test run, say
        calls.append((t0, time.monotonic()))
        return float(response.strip() == str(ground_truth))

    run = build(
        pm,
        "quickstart_async",
        quickstart_dir,
        tmp_path / "run",
        "trainer.total_steps=3",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "rollout.backend.background_thread=false",
        # 16 sequences at a time: a window's generation takes many engine steps, so chunks finish
        # and are scored while it goes on (with every sequence at once a quiet machine finished a
        # window's generation in a few steps, before the first chunk reached a scorer)
        "rollout.backend.max_num_seqs=16",
        scorer=slow,
    )
    runner = run.loop()
    engine = runner.s.rollout.engine
    steps: list[float] = []
    step = engine.step

    def timed_step() -> int:
        steps.append(time.monotonic())
        return step()

    engine.step = timed_step
    summary = runner.run()
    assert summary["steps"] == 3 and calls and steps
    during = [t for t in steps if any(a < t < b for a, b in calls)]
    assert during, f"no engine step ran during any of {len(calls)} scorer calls"
    recs = read_metrics(Path(summary["run_dir"]))
    assert sum(r["rollouter/scoring_s"] for r in recs) > 0
    trained = runner.source.prompts.trained_keys
    assert len(trained) == len(set(trained)) == 3 * 16
