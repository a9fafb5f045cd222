"""The ``tool_arithmetic`` dataset and scorer: held-out pairs, the ``sum_digits`` filter, the
tokenizer's vocabulary, and answers read after the last ``=`` (an echoed calc line)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlzoo.data.tokenizer import load_tokenizer
from rlzoo.kernel.errors import RlzooError
from rlzoo.tasks._tools import prepare, score
from rlzoo.tasks.tools import ToolArithmeticDataParams


@pytest.mark.parametrize("sum_digits", [3, 4])
def test_sum_digits_keeps_only_sums_of_that_length_and_holds_val_out(tmp_path: Path, sum_digits: int) -> None:
    files = prepare(tmp_path, ToolArithmeticDataParams(train_size=64, val_size=16, sum_digits=sum_digits))
    train, val = (pq.read_table(files[k]).to_pylist() for k in ("train", "val"))
    pairs = {
        k: [(r["extra_info"]["a"], r["extra_info"]["b"]) for r in rows]
        for k, rows in (("train", train), ("val", val))
    }
    assert len(pairs["train"]) == 64 and len(pairs["val"]) == 16
    assert all(
        len(str(a + b)) == sum_digits and min(a, b) >= 100 and max(a, b) <= 999
        for a, b in pairs["train"] + pairs["val"]
    )
    assert not set(pairs["train"]) & set(pairs["val"])
    assert all(
        r["reward_model"]["ground_truth"] == str(r["extra_info"]["a"] + r["extra_info"]["b"]) for r in train
    )


def test_an_impossible_sum_length_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(
        RlzooError, match=r"sum_digits=2 is impossible for two 3-digit numbers: use 3, 4 or 0"
    ):
        prepare(tmp_path, ToolArithmeticDataParams(sum_digits=2))
    assert not (tmp_path / "train.parquet").exists()


def test_held_out_pairs_that_leave_nothing_to_train_on_are_refused(tmp_path: Path) -> None:
    # 1-digit numbers with a 1-digit sum: 36 pairs, all of them drawn for validation by 400 draws
    with pytest.raises(RlzooError, match=r"no 1-digit pair is left to draw .* lower val_size"):
        prepare(tmp_path, ToolArithmeticDataParams(digits=1, sum_digits=1, val_size=400, train_size=8))


def test_model_knows_every_word_of_the_task_and_a_stale_cache_is_rebuilt(tmp_path: Path) -> None:
    files = prepare(tmp_path, ToolArithmeticDataParams(train_size=4, val_size=2))
    tok = load_tokenizer(files["model"])
    line = "calc 1 2 3 + 4 5 6 = ? ? ? Answer: 5 7 9"  # every word reads back as itself
    assert tok.convert_ids_to_tokens(tok(line, add_special_tokens=False)["input_ids"]) == line.split()
    stamp = tmp_path / "tool_arithmetic_params.json"
    stamp.write_text(stamp.read_text().replace('"_words": "', '"_words": "old '))  # an older vocabulary
    prepare(tmp_path, ToolArithmeticDataParams(train_size=4, val_size=2))
    assert '"_words": "0 1' in stamp.read_text()


@pytest.mark.parametrize(
    ("response", "acc"),
    [
        ("Answer: 5 7 9", 1.0),
        ("5 7 9", 1.0),
        ("Answer: 1 2 3 + 4 5 6 = 5 7 9", 1.0),  # an echoed calc line answers its result
        ("1 2 3 + 4 5 6 = 5 7 8", 0.0),
        ("Answer: 1 2 3 + 4 5 6", 0.0),  # the question is no answer
    ],
)
def test_scorer_reads_the_number_after_the_last_equals_sign(response: str, acc: float) -> None:
    assert score(response, "579", "rlzoo/tool_arithmetic", {}, None)["acc"] == acc
