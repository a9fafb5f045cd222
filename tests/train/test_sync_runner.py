"""The sync runner end to end on the quickstart task (tiny model, CPU, real parquet and tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import rlzoo
from rlzoo.kernel.errors import ConfigError, RlzooError
from rlzoo.report.metrics import read_metrics


def overrides(tmp: Path, quickstart_dir: Path, **kw: object) -> list[str]:
    base = {
        "data.dir": str(quickstart_dir),
        "run.output_dir": str(tmp / "run"),
        "run.loggers": "[jsonl,tensorboard]",
        "run.progress": "false",
        "trainer.total_steps": 3,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
    }
    base.update(kw)
    return [f"{k}={v}" for k, v in base.items()]


def test_run_writes_metrics_tensorboard_and_records(tmp_path: Path, quickstart_dir: Path) -> None:
    run = rlzoo.build_run("quickstart", overrides(tmp_path, quickstart_dir, **{"trainer.test_freq": 3}))
    summary = run.train()
    run_dir = Path(summary["run_dir"])
    records = read_metrics(run_dir)
    steps = [r["step"] for r in records]
    assert steps == [0, 1, 2, 3]  # validation before training, then one record per step
    assert "val/mean" in records[0] and "val/mean" in records[-1]
    for key in (
        "critic/score/mean",
        "response_length/mean",
        "actor/pg_clipfrac",
        "actor/entropy",
        "actor/grad_norm",
        "timing_s/gen",
        "timing_s/update_actor",
        "perf/throughput",
    ):
        assert key in records[1], key
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    plugins = json.loads((run_dir / "plugins.json").read_text())
    names = {p["name"] for p in plugins["plugins"]}
    assert "rlzoo.algorithms.advantage" in names
    assert plugins["parts"]["algorithm.advantage"]["name"] == "grpo"
    assert (run_dir / "config.yaml").exists()
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_3"


def test_loop_learns(tmp_path: Path, quickstart_dir: Path) -> None:
    """60 GRPO steps lift the training reward well above its starting level (same seed, same curve)."""
    run = rlzoo.build_run(
        "quickstart",
        overrides(
            tmp_path, quickstart_dir, **{"trainer.total_steps": 60, "trainer.val_before_train": "false"}
        ),
    )
    run.train()
    rewards = [r["critic/score/mean"] for r in read_metrics(run.run_dir) if "critic/score/mean" in r]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.1, (first, last, rewards)


def test_resume_gives_the_same_next_step(tmp_path: Path, quickstart_dir: Path) -> None:
    keys = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean")
    a = rlzoo.build_run(
        "quickstart",
        overrides(
            tmp_path / "a",
            quickstart_dir,
            **{"trainer.total_steps": 4, "trainer.save_freq": 2, "trainer.val_before_train": "false"},
        ),
    )
    a.train()
    full = {r["step"]: r for r in read_metrics(a.run_dir)}
    # a copy of the run as it was after step 2 (its step-2 checkpoint is the latest one)
    b_dir = tmp_path / "b" / "run"
    shutil.copytree(a.run_dir / "checkpoints" / "step_2", b_dir / "checkpoints" / "step_2")
    (b_dir / "checkpoints" / "latest").write_text("step_2")
    b = rlzoo.build_run(
        "quickstart",
        overrides(
            tmp_path / "b",
            quickstart_dir,
            **{"trainer.total_steps": 4, "resume": "true", "trainer.val_before_train": "false"},
        ),
    )
    b.train()
    resumed = {r["step"]: r for r in read_metrics(b.run_dir)}
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for k in keys:
            assert resumed[step][k] == pytest.approx(full[step][k], rel=1e-5, abs=1e-7), (step, k)


def test_rollout_log_probs_match_trainer(quickstart_dir: Path) -> None:
    """The engine's per-token log-probs equal the train backend's recomputation for the same weights."""
    from rlzoo.train.batching import make_requests, samples_to_batch, sampling_params

    run = rlzoo.build_run("quickstart", [f"data.dir={quickstart_dir}", "rollout.temperature=0.7"])
    cfg = run.config
    from rlzoo.train.inputs import load_tokenizer, rollout_spec, train_spec

    tok = load_tokenizer(cfg)
    rollout = cfg.rollout.backend.fn(cfg.rollout.backend.params, rollout_spec(cfg, tok))
    trainer = cfg.trainer.backend.fn(cfg.trainer.backend.params, train_spec(cfg, 1, tok))
    items = [
        {
            "prompt_ids": tok.apply_chat_template(
                [{"role": "user", "content": f"first {a} {b}"}], add_generation_prompt=True, tokenize=True
            )["input_ids"],
            "ground_truth": str(a),
        }
        for a, b in [(1, 2), (3, 4), (5, 6)]
    ]
    samples = rollout.generate(make_requests(items, sampling_params(cfg, seed=3), prefix="t"))
    batch = samples_to_batch(samples, None, int(tok.pad_token_id))
    lp, _ = trainer.compute_log_probs(batch)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(lp[mask], batch["rollout_log_probs"][mask], atol=1e-5, rtol=1e-5)
    rollout.shutdown()


def test_bad_inputs_fail_before_models_load(tmp_path: Path, quickstart_dir: Path) -> None:
    # a missing model path
    run = rlzoo.build_run(
        "quickstart", overrides(tmp_path, quickstart_dir, **{"model.path": str(tmp_path / "nope")})
    )
    with pytest.raises(ConfigError, match=r"model\.path"):
        run.train()
    # a dataset without the answer column
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.table({"data_source": ["x"], "prompt": [[{"role": "user", "content": "first 1 2"}]]}), bad
    )
    run = rlzoo.build_run(
        "quickstart", overrides(tmp_path, quickstart_dir, **{"data.train_files": f"[{bad}]"})
    )
    with pytest.raises(RlzooError, match=r"bad\.parquet"):
        run.train()
    # a tokenizer without a chat template
    tok_dir = tmp_path / "tok"
    shutil.copytree(quickstart_dir / "model", tok_dir)
    cfg_path = tok_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    for f in tok_dir.glob("chat_template.*"):
        f.unlink()
    run = rlzoo.build_run(
        "quickstart", overrides(tmp_path, quickstart_dir, **{"model.tokenizer_path": str(tok_dir)})
    )
    with pytest.raises(RlzooError, match="chat template"):
        run.train()


def test_failing_scorer_counts_failures_and_the_run_continues(tmp_path: Path, quickstart_dir: Path) -> None:
    calls = {"n": 0}

    def flaky(response, ground_truth, data_source, extra_info, params):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise ValueError("scorer exploded")
        if calls["n"] % 3 == 1:
            return float("nan")
        return 1.0

    run = rlzoo.build_run(
        "quickstart",
        overrides(
            tmp_path, quickstart_dir, **{"trainer.val_before_train": "false", "trainer.total_steps": 2}
        ),
        scorer=flaky,
    )
    run.train()
    recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert all(r["reward/failed"] > 0 for r in recs)
    assert len(recs) == 2


def test_ppo_with_critic_learns(tmp_path: Path, quickstart_dir: Path) -> None:
    """GAE with a critic (value head trained with the clipped value loss) also learns the task."""
    run = rlzoo.build_run(
        "quickstart",
        overrides(
            tmp_path,
            quickstart_dir,
            **{
                "algorithm.advantage": "gae",
                "trainer.total_steps": 60,
                "trainer.val_before_train": "false",
                "trainer.optim.critic_lr": 1e-3,
            },
        ),
    )
    assert run.config.algorithm.advantage.capability("needs_critic")
    run.train()
    recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert all("critic/vf_loss" in r for r in recs)
    rewards = [r["critic/score/mean"] for r in recs]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.1, (first, last)


SWITCHES = [
    ["algorithm.advantage=rloo"],
    ["algorithm.advantage=reinforce_plus_plus"],
    ["algorithm.advantage=reinforce_plus_plus_baseline"],
    ["algorithm.advantage=remax"],
    ["algorithm.advantage=opo"],
    ["algorithm.advantage=gpg", "algorithm.policy_loss=gpg"],
    ["algorithm.advantage=grpo_passk"],
    ["algorithm.advantage.norm_by_std=false", "algorithm.loss_agg=seq-mean-token-sum-norm"],
    ["algorithm.policy_loss=gspo", "algorithm.loss_agg=seq-mean-token-mean"],
    ["algorithm.policy_loss=cispo"],
    ["algorithm.policy_loss=sapo"],
    ["algorithm.policy_loss=geo_mean"],
    ["algorithm.policy_loss=dppo_tv"],
    ["algorithm.policy_loss=dppo_kl"],
    ["algorithm.policy_loss=clip_cov"],
    ["algorithm.policy_loss=kl_cov"],
    ["algorithm.loss_agg=token-sum"],
    ["algorithm.loss_agg=seq-mean-token-sum"],
    ["algorithm.use_kl_loss=true", "algorithm.kl_loss=k3+", "algorithm.kl_loss_coef=0.01"],
    ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"],
    ["+algorithm.rollout_correction.name=icepop"],
    ["+algorithm.rollout_correction.name=seq_is", "+algorithm.rollout_correction.mode=bypass"],
    ["+algorithm.sample_filter.name=dynamic_sampling", "+algorithm.sample_filter.max_num_gen_batches=3"],
    ["reward.manager=batch"],
    # need sum_pi_squared (+ old log-probs) from the train backend's old-log-prob forward
    ["algorithm.advantage=optimal_token_baseline"],
    ["algorithm.advantage=tir_optimal_token_baseline"],
    ["algorithm.advantage=optimal_token_baseline", "+algorithm.rollout_correction.name=seq_is"],
    # reward components from the scorer's dict ('acc', and its 'score')
    ["algorithm.advantage=gdpo", "algorithm.advantage.reward_keys=[acc,score]"],
    ["algorithm.advantage=gdpo"],
]


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: " ".join(s))
def test_quickstart_runs_with_any_part(tmp_path: Path, quickstart_dir: Path, switch: list[str]) -> None:
    """Every estimator / loss / aggregation / KL / correction / filter can be switched in by override."""
    ovr = (
        overrides(tmp_path, quickstart_dir, **{"trainer.total_steps": 2, "trainer.val_before_train": "false"})
        + switch
    )
    run = rlzoo.build_run("quickstart", ovr)
    run.train()
    recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert r["actor/grad_norm"] is not None  # finite (None would mean NaN / inf)


def test_gdpo_with_a_key_the_scorer_does_not_return_fails_on_the_first_step(
    tmp_path: Path, quickstart_dir: Path
) -> None:
    """Which keys a scorer returns is known only once it has scored: the first step says which is missing."""
    ovr = overrides(
        tmp_path, quickstart_dir, **{"trainer.total_steps": 2, "trainer.val_before_train": "false"}
    )
    run = rlzoo.build_run(
        "quickstart", [*ovr, "algorithm.advantage=gdpo", "algorithm.advantage.reward_keys=[acc,format]"]
    )
    with pytest.raises(
        ValueError, match=r"reward key 'format'.*scorer returned.*'acc': .*'pred': .*'score': "
    ):
        run.train()
    assert not [r for r in read_metrics(run.run_dir) if r["step"] > 0]  # no step was recorded


def test_same_seed_same_curve(tmp_path: Path, quickstart_dir: Path) -> None:
    curves = []
    for name in ("a", "b"):
        run = rlzoo.build_run(
            "quickstart", overrides(tmp_path / name, quickstart_dir, **{"trainer.total_steps": 3})
        )
        run.train()
        curves.append(
            [
                (r.get("critic/score/mean"), r.get("actor/grad_norm"), r.get("val/mean"))
                for r in read_metrics(run.run_dir)
            ]
        )
    assert curves[0] == curves[1]
