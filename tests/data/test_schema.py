"""The parquet schema check: clear errors naming the file, the column and what is expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlzoo.data.schema import (
    GROUND_TRUTH_COLUMNS,
    REQUIRED_COLUMNS,
    SchemaError,
    validate_files,
)

from .conftest import chat_row, write_rows


def test_required_columns() -> None:
    assert REQUIRED_COLUMNS == ("data_source", "prompt")
    assert GROUND_TRUTH_COLUMNS == ("ground_truth", "reward_model")


def test_verl_layout_and_flat_ground_truth_both_pass(tmp_path: Path) -> None:
    verl = write_rows(tmp_path / "verl.parquet", [chat_row("what is one plus one")])
    flat = write_rows(
        tmp_path / "flat.parquet",
        [{"data_source": "x", "prompt": [{"role": "user", "content": "hi"}], "ground_truth": "1"}],
    )
    validate_files([verl, flat])


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    f = write_rows(tmp_path / "bad.parquet", [{"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}])
    with pytest.raises(SchemaError) as err:
        validate_files(f)
    msg = str(err.value)
    assert f"{f}: missing column(s) 'data_source'" in msg
    assert "no 'reward_model' (struct with 'ground_truth') or 'ground_truth' column" in msg
    assert "found columns: prompt, answer" in msg
    assert "Expected rlzoo's prompt schema" in msg and "rlzoo prepare" in msg
    assert len(err.value.problems) == 2


def test_every_file_reported_at_once(tmp_path: Path) -> None:
    good = write_rows(tmp_path / "good.parquet", [chat_row("hi")])
    bad = write_rows(tmp_path / "bad.parquet", [{"data_source": "x", "ground_truth": "1"}])
    with pytest.raises(SchemaError) as err:
        validate_files([good, bad, tmp_path / "missing.parquet"])
    msg = str(err.value)
    assert "2 prompt file problem(s)" in msg
    assert f"{bad}: missing column(s) 'prompt'" in msg
    assert f"{tmp_path / 'missing.parquet'}: no such file" in msg


def test_wrong_types(tmp_path: Path) -> None:
    f = write_rows(
        tmp_path / "t.parquet",
        [{"data_source": "x", "prompt": [1, 2], "reward_model": {"style": "rule"}}],
    )
    with pytest.raises(SchemaError) as err:
        validate_files(f, prompt_key="prompt")
    msg = str(err.value)
    assert "column 'reward_model' must be a struct with a 'ground_truth' field" in msg
    assert "column 'prompt' must hold chat messages" in msg


def test_custom_prompt_key(tmp_path: Path) -> None:
    f = write_rows(tmp_path / "q.parquet", [{"data_source": "x", "question": "hi", "ground_truth": "1"}])
    validate_files(f, prompt_key="question")  # a string column is one user message
    with pytest.raises(SchemaError, match="missing column\\(s\\) 'prompt'"):
        validate_files(f)


def test_not_parquet(tmp_path: Path) -> None:
    f = tmp_path / "x.parquet"
    f.write_text("not parquet")
    with pytest.raises(SchemaError, match="not a readable parquet file"):
        validate_files(f)
    with pytest.raises(SchemaError, match="is a directory"):
        validate_files(tmp_path)
