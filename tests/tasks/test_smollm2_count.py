"""The ``smollm2_count`` dataset (long-tailed answers for the real-overlap benchmark) and the ``counting``
scorer: scores worked out by hand, the held-out split, the 1/L length law, and the recipe for two steps on a
tiny GGUF standing in for SmolLM2, sync and fully_async."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rlzoo
from rlzoo.report.metrics import read_metrics
from rlzoo.tasks._smollm2 import count_prompt, prepare_count, score_count
from rlzoo.tasks.smollm2 import SmolLM2CountParams


def test_prompt_states_the_range() -> None:
    assert count_prompt(7, 19) == "Count from 7 to 19. Reply with only the numbers, separated by spaces."


@pytest.mark.parametrize(
    ("response", "score", "acc"),
    [
        ("7 8 9 10", 1.0, 1.0),
        ("7, 8, 9, 10<|im_end|>", 1.0, 1.0),  # separators do not matter, the integers do
        ("7 8 10", 0.5 * 2 / 4, 0.0),  # right up to 8: 2 of 4 before the first mistake
        ("7 8 9 10 11", 0.5 * 4 / 4, 0.0),  # past the end is not exact: half credit for the 4
        ("Sure! 8 9 10", 0.0, 0.0),  # wrong from the first number
        ("", 0.0, 0.0),
    ],
)
def test_counting_scores_by_hand(response: str, score: float, acc: float) -> None:
    got = score_count(response, "7 10", "rlzoo/count", {}, None)
    assert got["score"] == pytest.approx(score) and got["acc"] == acc


def test_params_refuse_a_split_with_nothing_left_to_train_on() -> None:
    with pytest.raises(ValueError, match="leaves nothing to train on"):
        SmolLM2CountParams(max_count=4, max_start=2, val_size=5)


def test_dataset_holds_out_validation_and_lengths_are_long_tailed(tmp_path: Path, gguf_file: Path) -> None:
    params = SmolLM2CountParams(max_count=40, train_size=4000, val_size=30, gguf_file=str(gguf_file))
    files = prepare_count(tmp_path, params)
    train, val = (pq.read_table(files[k]).to_pylist() for k in ("train", "val"))
    assert (len(train), len(val)) == (4000, 30)
    pairs = {r["reward_model"]["ground_truth"] for r in val}
    assert len(pairs) == 30 and not pairs & {r["reward_model"]["ground_truth"] for r in train}
    counts = Counter(r["extra_info"]["count"] for r in train)
    for r in train[:50]:
        start, stop = (int(x) for x in r["reward_model"]["ground_truth"].split())
        assert stop - start + 1 == r["extra_info"]["count"] and 1 <= start <= 20
    # P(L) = (1/L) / H_40 with H_40 = sum 1/k ~ 4.2785: P(1) ~ 0.234, P(L >= 20) ~ 0.163 (by hand)
    h40 = sum(1 / k for k in range(1, 41))
    assert counts[1] / 4000 == pytest.approx(1 / h40, abs=0.03)
    assert sum(c for n, c in counts.items() if n >= 20) / 4000 == pytest.approx(
        sum(1 / k for k in range(20, 41)) / h40, abs=0.03
    )
    assert max(counts) == 40


@pytest.mark.parametrize("runner", [[], ["runner=fully_async"]], ids=["sync", "fully_async"])
def test_recipe_runs_two_steps_on_a_tiny_gguf(tmp_path: Path, gguf_file: Path, runner: list[str]) -> None:
    run = rlzoo.build_run(
        "grpo_smollm2_count",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            f"+data.prepare.gguf_file={gguf_file}",
            "data.prepare.train_size=32",
            "data.prepare.val_size=2",
            "data.max_prompt_length=256",
            "data.max_response_length=8",
            "data.train_batch_size=2",
            "rollout.n=2",
            "trainer.ppo_mini_batch_size=2",
            "trainer.total_steps=2",
            "trainer.test_freq=-1",
            "run.progress=false",
            *runner,
        ],
    )
    run.train()
    recs = [r for r in read_metrics(run.run_dir) if r["step"] >= 1]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert 0.0 <= r["critic/score/mean"] <= 1.0 and r["response_length/mean"] > 0
