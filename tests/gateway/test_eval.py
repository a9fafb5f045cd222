"""``rlzoo eval`` of a gateway run: each episode is played by the run's own agent through the
gateway (the recipe's ``calc_agent``), judged as in training, and counted once."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlzoo
from rlzoo.kernel.protocols import RewardResult, Sample
from rlzoo.train.evaluate import EvalSettings, episode_answers, evaluate, read_results

pytest.importorskip("openai")


def _sample(rid: str, index: int, segment: int | None, segments: int = 1) -> Sample:
    agent = None if segment is None else {"gateway": {"segment": segment, "segments": segments}}
    return Sample(
        request_id=rid,
        index=index,
        prompt_ids=[1],
        response_ids=[2],
        rollout_log_probs=[-0.5],
        versions=[0],
        finish_reason="stop",
        agent=agent,
    )


def test_a_split_episode_is_one_answer_its_last_calls() -> None:
    samples = [
        _sample("a", 0, 0, 2),
        _sample("a", 0, 1, 2),  # episode (a, 0) was split in two: its answer is segment 1
        _sample("a", 1, 0, 1),
        _sample("b", 0, None),  # not a gateway sample (single answer or native multi-turn)
    ]
    results = [RewardResult(reward=float(i), score=float(i)) for i in range(4)]
    got = episode_answers(samples, results)
    assert [(s.request_id, s.index, r.score) for s, r in got] == [("a", 0, 1.0), ("a", 1, 2.0), ("b", 0, 3.0)]


def test_a_gateway_run_is_evaluated_through_its_agent(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    rlzoo.build_run(
        "quickstart_gateway",
        [
            "stages=[]",  # its GRPO stage alone: the agent through the gateway
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={run_dir}",
            "run.progress=false",
            "run.loggers=[jsonl]",
            "trainer.total_steps=1",
            "trainer.save_freq=1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "data.train_batch_size=4",
            "trainer.ppo_mini_batch_size=4",
            "rollout.n=2",
        ],
    ).train()
    settings = EvalSettings(
        n=2, temperature=1.0, seed=0, threshold=1.0, limit=4, batch=4, bootstrap=50, level=0.9
    )
    summary = evaluate([f"{run_dir}@latest"], settings, out=tmp_path / "eval", progress=False)
    assert summary["prompts"] == 4
    rows = read_results(tmp_path / "eval")
    assert len(rows) == 4 and all(len(r["responses"]) == 2 for r in rows)
    assert all(t >= 1 for r in rows for t in r["turns"])  # the agent's calls, through the gateway
    assert not any(f for r in rows for f in r["failed"])  # every episode played and judged
