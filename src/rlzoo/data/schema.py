"""The one parquet schema every rlzoo prompt file follows (verl-compatible).

Every dataset preparer writes it and :class:`rlzoo.data.dataset.PromptDataset` reads it. It is
verl's RL parquet layout, so files written by ``rlzoo prepare`` train unchanged in verl, and verl's
files (and hub datasets already in that layout, such as DAPO-Math-17k) are valid rlzoo files:

=================  ==========================================  ========  ===========================
column             type                                        required  meaning
=================  ==========================================  ========  ===========================
``data_source``    string                                      yes       routes the sample to its
                                                                         scorer (``openai/gsm8k``)
``prompt``         list<struct<role: string, content: string>> yes       chat messages; an image's
                                                                         place in a message is
                                                                         ``<image>``
``reward_model``   struct<style: string, ground_truth: string> yes [1]   verl's layout of the answer
``ground_truth``   string                                      yes [1]   flat alternative, read only
``images``         list<struct<bytes: binary, path: string>>   no        images of a multimodal
                   (or list<binary>), null for none                      prompt, in placeholder order
``ability``        string                                      no        task family (``math``)
``extra_info``     struct<split, index, ...>                   no        anything else; passed to
                                                                         scorers untouched
=================  ==========================================  ========  ===========================

[1] one of the two: preparers write ``reward_model`` (``style`` is ``"rule"``); readers take a
top-level ``ground_truth`` column first when both exist.

Importing this module is cheap (pyarrow is imported inside the functions that read files).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlzoo.kernel.errors import RlzooError

if TYPE_CHECKING:
    import pyarrow as pa

#: Columns every prompt file must have.
REQUIRED_COLUMNS: tuple[str, ...] = ("data_source", "prompt")
#: A file must have at least one of these; the first present wins when reading.
GROUND_TRUTH_COLUMNS: tuple[str, ...] = ("ground_truth", "reward_model")
#: A row's own reply (text: one assistant turn): what ``runner.on_policy_fraction < 1`` trains on.
RESPONSE_COLUMN = "response"
#: Columns a file may have; read when present.
OPTIONAL_COLUMNS: tuple[str, ...] = ("images", "ability", "extra_info", RESPONSE_COLUMN)
#: Every column of the schema, in the order preparers write them.
SCHEMA_COLUMNS: tuple[str, ...] = (
    "data_source",
    "prompt",
    "images",
    "ability",
    "reward_model",
    "extra_info",
)
#: Where an image goes in a message's text (verl / LLaVA convention); one per image, in order.
IMAGE_PLACEHOLDER = "<image>"
#: ``reward_model.style`` the built-in preparers write (a rule-based scorer checks the answer).
REWARD_STYLE = "rule"

EXPECTED = (
    "rlzoo's prompt schema: data_source (string), prompt (list of {role, content} chat messages), "
    "and the answer as reward_model {style, ground_truth} (verl's layout) or a ground_truth "
    "(string) column; optional: images, ability, extra_info. Write it with `rlzoo prepare NAME` "
    "(see docs/data.md)"
)


class SchemaError(RlzooError, ValueError):
    """A prompt file does not follow rlzoo's schema. The message names each file and column."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            msg = f"{self.problems[0]}\nExpected {EXPECTED}."
        else:
            lines = [f"{len(self.problems)} prompt file problem(s):"]
            lines += [f"  - {p}" for p in self.problems]
            lines.append(f"Expected {EXPECTED}.")
            msg = "\n".join(lines)
        super().__init__(msg)


def ground_truth_column(columns: Iterable[str]) -> str | None:
    """The column the ground truth is read from (``ground_truth`` before ``reward_model``)."""
    cols = set(columns)
    for name in GROUND_TRUTH_COLUMNS:
        if name in cols:
            return name
    return None


def schema_problems(path: str | Path, schema: pa.Schema, *, prompt_key: str = "prompt") -> list[str]:
    """What is wrong with one file's arrow ``schema`` (an empty list when nothing is)."""
    import pyarrow as pa

    names = list(schema.names)
    found = ", ".join(names) if names else "(none)"
    problems: list[str] = []
    required = [prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS]
    missing = [c for c in required if c not in names]
    if missing:
        problems.append(
            f"{path}: missing column(s) {', '.join(repr(c) for c in missing)}; found columns: {found}"
        )
    gt = ground_truth_column(names)
    if gt is None:
        problems.append(
            f"{path}: missing the answer: no 'reward_model' (struct with 'ground_truth') or "
            f"'ground_truth' column; found columns: {found}"
        )
    elif gt == "reward_model":
        t = schema.field("reward_model").type
        if not (pa.types.is_struct(t) and t.get_field_index("ground_truth") >= 0):
            problems.append(
                f"{path}: column 'reward_model' must be a struct with a 'ground_truth' field "
                f"(verl's layout), got {t}"
            )
        else:
            problems += _ground_truth_type(path, "reward_model.ground_truth", t.field("ground_truth").type)
    else:
        problems += _ground_truth_type(path, "ground_truth", schema.field("ground_truth").type)
    if prompt_key in names:
        t = schema.field(prompt_key).type
        ok = pa.types.is_string(t) or pa.types.is_large_string(t)
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            v = t.value_type
            ok = pa.types.is_struct(v) and all(v.get_field_index(k) >= 0 for k in ("role", "content"))
        if not ok:
            problems.append(
                f"{path}: column {prompt_key!r} must hold chat messages (list of struct with 'role' "
                f"and 'content') or a string, got {t}"
            )
    return problems


def _ground_truth_type(path: str | Path, column: str, t: Any) -> list[str]:
    """A ground truth is a string; integers and floats are read as their decimal text
    (:func:`row_ground_truth`); anything else (a list, a struct, a bool) is refused."""
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return []
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return []
    return [
        f"{path}: column {column!r} must hold the answer as a string (numbers are read as their decimal "
        f"text), got {t}; scorers compare one answer string, so turn it into one when preparing the data "
        "(e.g. pick the canonical answer, or join the accepted ones and use a scorer that splits them)"
    ]


def validate_files(files: str | Path | Iterable[str | Path], *, prompt_key: str = "prompt") -> None:
    """Check the columns of parquet prompt files before any model loads.

    Reads only each file's footer. Raises :class:`SchemaError` listing every problem of every
    file at once (a missing file, a missing column, a column of the wrong type), naming the file,
    the column and what rlzoo expects.
    """
    import pyarrow.parquet as pq

    if isinstance(files, (str, Path)):
        files = [files]
    problems: list[str] = []
    paths = list(files)
    if not paths:
        raise SchemaError(["no prompt files given"])
    for f in paths:
        p = Path(f)
        if not p.exists():
            problems.append(f"{p}: no such file")
            continue
        if p.is_dir():
            problems.append(f"{p}: is a directory; give the parquet files (e.g. {p}/train.parquet)")
            continue
        try:
            schema = pq.read_schema(p)
        except Exception as exc:
            problems.append(f"{p}: not a readable parquet file ({type(exc).__name__}: {exc})")
            continue
        problems.extend(schema_problems(p, schema, prompt_key=prompt_key))
    if problems:
        raise SchemaError(problems)


def row_ground_truth(row: Mapping[str, Any], column: str) -> Any:
    """The ground truth of one row read from ``column`` (see :func:`ground_truth_column`)."""
    value = row.get(column)
    if column == "reward_model":
        value = value.get("ground_truth") if isinstance(value, Mapping) else None
    if isinstance(value, bool):
        return value  # refused by the schema check; left as is
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return value


def reward_model(ground_truth: str, style: str = REWARD_STYLE) -> dict[str, str]:
    """The ``reward_model`` cell preparers write."""
    return {"style": style, "ground_truth": ground_truth}


def rows_without_response(files: list[str]) -> str:
    """What lacks a response in the training parquet files that exist ('' when none): a file
    without the column, or the first row whose response is null or empty."""
    import pyarrow.parquet as pq

    for f in files:
        path = Path(f).expanduser()
        if not path.is_file():
            continue  # not prepared yet: the batch source checks it again when the run is built
        if RESPONSE_COLUMN not in pq.read_schema(path).names:
            return f"{path} has no {RESPONSE_COLUMN!r} column"
        for i, value in enumerate(pq.read_table(path, columns=[RESPONSE_COLUMN]).column(0).to_pylist()):
            if not isinstance(value, str) or not value.strip():
                return f"{path} row {i} has {value!r}"
    return ""
