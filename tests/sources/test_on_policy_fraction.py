"""runner.on_policy_fraction (TRL GKD's lmbda): 1 is the runner as before, bit for bit; 0 trains only on
the rows' own responses; a row without a response is refused by validate; the per-step draw is
uniform (a fraction lambda of the steps on-policy)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import rlzoo
from rlzoo.kernel.errors import ConfigError
from rlzoo.report.metrics import read_metrics

BASE = [
    "run.progress=false",
    "run.loggers=[jsonl]",
    "trainer.total_steps=2",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "data.train_batch_size=8",
    "trainer.ppo_mini_batch_size=4",
    "rollout.n=2",
]


def with_responses(src: Path, dst: Path, *, blank_row: int | None = None) -> Path:
    """A copy of the quickstart data whose training rows carry ``response`` = the answer digit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(src, dst)
    rows = pq.read_table(dst / "train.parquet").to_pylist()
    for i, row in enumerate(rows):
        row["response"] = None if i == blank_row else str(row["reward_model"]["ground_truth"])
    pq.write_table(pa.Table.from_pylist(rows), dst / "train.parquet")
    return dst


@pytest.fixture(scope="module")
def answered(quickstart_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_responses(quickstart_dir, tmp_path_factory.mktemp("answered") / "data")


def train(data_dir: Path, out: Path, *extra: str) -> list[dict]:
    run = rlzoo.build_run("quickstart", [f"data.dir={data_dir}", f"run.output_dir={out}", *BASE, *extra])
    run.train()
    return [r for r in read_metrics(out) if r["step"] > 0]


KEYS = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def test_fraction_one_is_the_runner_as_before(quickstart_dir: Path, answered: Path, tmp_path: Path) -> None:
    before = train(quickstart_dir, tmp_path / "before")
    lam1 = train(answered, tmp_path / "lam1", "runner={name: sync, on_policy_fraction: 1.0}")
    for a, b in zip(before, lam1, strict=True):
        for k in KEYS:
            assert a[k] == b[k], k  # bit for bit
        assert "rollout/on_policy" not in b  # nothing drawn


def test_fraction_zero_trains_on_the_rows_responses(answered: Path, tmp_path: Path) -> None:
    """Every trained response is the row's answer as the tokenizer writes it after the prompt, with
    the end-of-sequence token (computed with the tokenizer's own chat template), n copies per prompt."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    rows = train(answered, tmp_path / "run", "runner={name: sync, on_policy_fraction: 0.0}")
    assert [r["rollout/on_policy"] for r in rows] == [0.0, 0.0]
    assert all(r["critic/score/mean"] == 1.0 for r in rows)  # the answers are right
    tok = AutoTokenizer.from_pretrained(str(answered / "model"))
    samples = pq.read_table(tmp_path / "run" / "samples" / "step_000001.parquet").to_pylist()
    assert len(samples) == 8 * 2
    by_prompt = {}
    for smp in samples:
        by_prompt.setdefault(smp["request_id"], []).append(smp["response_ids"])
    assert len(by_prompt) == 8 and all(len(v) == 2 and v[0] == v[1] for v in by_prompt.values())
    for smp in samples:
        digit = next(ch for ch in smp["prompt"].split("<|assistant|>")[0] if ch.isdigit())
        assert smp["response_ids"] == [*tok(digit, add_special_tokens=False)["input_ids"], tok.eos_token_id]


def test_validate_refuses_a_row_without_response(quickstart_dir: Path, tmp_path: Path) -> None:
    blank = with_responses(quickstart_dir, tmp_path / "blank", blank_row=3)

    def build(data_dir: Path, lam: float) -> None:
        rlzoo.build_run(
            "quickstart",
            [
                f"data.dir={data_dir}",
                f"run.output_dir={tmp_path / 'run'}",
                f"runner={{name: sync, on_policy_fraction: {lam}}}",
            ],
        )

    with pytest.raises(ConfigError, match=r"train\.parquet row 3 has None.*non-empty 'response'"):
        build(blank, 0.5)
    with pytest.raises(ConfigError, match=r"has no 'response' column"):
        build(quickstart_dir, 0.5)
    with pytest.raises(ConfigError, match="on_policy_fraction"):
        build(quickstart_dir, 1.5)


def test_the_draw_is_uniform_per_step() -> None:
    from rlzoo.sources.sync import on_policy_draw

    draws = [on_policy_draw(0, step) for step in range(1, 20001)]
    for lam in (0.1, 0.5, 0.9):
        share = sum(u <= lam for u in draws) / len(draws)
        assert abs(share - lam) < 0.015  # binomial sd <= 0.0036
    assert on_policy_draw(0, 7) == on_policy_draw(0, 7) != on_policy_draw(1, 7)
