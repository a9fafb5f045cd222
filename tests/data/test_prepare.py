"""The built-in preparers, run on local files with each dataset's upstream column layout."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rlzoo.data.schema import validate_files
from rlzoo.models.tiny import dapo_math_row, gsm8k_readme
from rlzoo.tasks.prepare._common import PrepareError, split_of_file, split_specs

from .conftest import png_bytes


def read(path: Path) -> list[dict[str, Any]]:
    validate_files([path])  # every file a preparer writes follows the schema
    return pq.read_table(path).to_pylist()


# ---------------------------------------------------------------------------------------------
# upstream layouts
# ---------------------------------------------------------------------------------------------
def make_geometry3k(root: Path) -> Path:
    """hiyouga/geometry3k as downloaded: data/<split>-00000-of-00001.parquet, images/problem/answer."""
    from datasets import Dataset, Features, Image, List, Value

    feats = Features({"images": List(Image()), "problem": Value("string"), "answer": Value("string")})
    rows = {
        "train": [
            ([png_bytes((255, 0, 0))], "<image>Find x.", "3"),
            ([png_bytes((0, 255, 0))], "Find the area of the figure.", "12.5"),  # no placeholder
            ([png_bytes((0, 0, 255))], "<image>Find y.", "7"),
        ],
        "validation": [([png_bytes()], "<image>Find z.", "1")],
        "test": [([png_bytes()], "<image>Find m \\angle 1.", "60")],
    }
    for split, items in rows.items():
        ds = Dataset.from_dict(
            {
                "images": [[{"bytes": b, "path": None} for b in imgs] for imgs, _, _ in items],
                "problem": [p for _, p, _ in items],
                "answer": [a for _, _, a in items],
            },
            features=feats,
        )
        (root / "data").mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return root


def make_gsm8k(root: Path) -> Path:
    """openai/gsm8k as downloaded: README configs, main/ and socratic/ parquet folders."""
    from datasets import Dataset

    main = {
        "train": [
            ("Tom has 3 apples and buys 4. How many?", "3 + 4 = <<3+4=7>>7\n#### 7"),
            ("A car costs 1,000 dollars twice. Total?", "2 * 1000 = 2000\n#### 2,000"),
            ("No marker here?", "it is 5"),
        ],
        "test": [("What is -2 times 3?", "-2*3=-6\n#### -6")],
    }
    for config in ("main", "socratic"):
        for split, items in main.items():
            tag = "" if config == "main" else "Socratic: "
            ds = Dataset.from_dict({"question": [tag + q for q, _ in items], "answer": [a for _, a in items]})
            (root / config).mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(root / config / f"{split}-00000-of-00001.parquet"))
    (root / "README.md").write_text(gsm8k_readme(("main", "socratic")))
    return root


dapo_row = dapo_math_row  # one row of DAPO-Math-17k / AIME-2024 as published


def make_dapo(path: Path, repeats: int = 3) -> Path:
    """DAPO-Math-17k's layout, every prompt repeated ``repeats`` times (as on the hub)."""
    from datasets import Dataset

    problems = [("Find 1+1.", "2"), ("Find 2*5.", "10"), ("Find 3^2.", "9")]
    rows = [dapo_row(p, a, f"uuid-{i}-{r}") for r in range(repeats) for i, (p, a) in enumerate(problems)]
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(path))
    return path


# ---------------------------------------------------------------------------------------------
# geometry3k
# ---------------------------------------------------------------------------------------------
def test_geometry3k_from_downloaded_repo(tmp_path: Path) -> None:
    from PIL import Image

    from rlzoo.tasks.prepare import geometry3k

    src = make_geometry3k(tmp_path / "geometry3k")
    out = geometry3k.prepare(tmp_path / "out", {"source": str(src)})
    assert set(out) == {"train", "validation", "test"}
    assert out["train"] == tmp_path / "out" / "train.parquet"

    rows = read(out["train"])
    assert len(rows) == 3
    r0 = rows[0]
    assert r0["data_source"] == "hiyouga/geometry3k"
    assert r0["ability"] == "math"
    assert r0["reward_model"] == {"style": "rule", "ground_truth": "3"}
    assert r0["prompt"] == [{"role": "user", "content": "<image>Find x. " + geometry3k.INSTRUCTION}]
    assert "<think> </think>" in geometry3k.INSTRUCTION and "\\boxed{}" in geometry3k.INSTRUCTION
    assert r0["extra_info"] == {"split": "train", "index": 0, "answer": "3", "question": "<image>Find x."}
    # the image bytes survive unchanged (no decode / re-encode)
    img = r0["images"][0]
    assert img["bytes"] == png_bytes((255, 0, 0))
    assert Image.open(io.BytesIO(img["bytes"])).size == (4, 3)
    # a problem without a placeholder gets one per image, in front
    assert rows[1]["prompt"][0]["content"].startswith("<image>Find the area")
    assert rows[1]["prompt"][0]["content"].count("<image>") == 1
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2]
    assert read(out["test"])[0]["extra_info"]["split"] == "test"


def test_geometry3k_output_reads_back_as_images_with_datasets(tmp_path: Path) -> None:
    """verl loads these files with datasets: the image feature metadata must be kept."""
    import datasets
    from PIL import Image

    from rlzoo.tasks.prepare import geometry3k

    out = geometry3k.prepare(
        tmp_path / "out", {"source": str(make_geometry3k(tmp_path / "g")), "splits": "test"}
    )
    ds = datasets.load_dataset("parquet", data_files=str(out["test"]))["train"]
    assert isinstance(ds[0]["images"][0], Image.Image)


def test_with_placeholders() -> None:
    from rlzoo.tasks.prepare.geometry3k import with_placeholders

    assert with_placeholders("<image>Find x.", 1) == ("<image>Find x.", False)
    assert with_placeholders("Find x.", 2) == ("<image><image>Find x.", True)
    assert with_placeholders("<image>a <image>b", 1) == ("<image>a b", True)


def test_limit_and_split_renaming(tmp_path: Path) -> None:
    from rlzoo.tasks.prepare import geometry3k

    src = make_geometry3k(tmp_path / "g")
    out = geometry3k.prepare(tmp_path / "out", {"source": str(src), "splits": ["train:val"], "limit": 2})
    assert list(out) == ["val"]
    rows = read(out["val"])
    assert len(rows) == 2 and rows[0]["extra_info"]["split"] == "val"


# ---------------------------------------------------------------------------------------------
# gsm8k
# ---------------------------------------------------------------------------------------------
def test_gsm8k_from_downloaded_repo_with_configs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from rlzoo.tasks.prepare import gsm8k

    src = make_gsm8k(tmp_path / "gsm8k")
    with caplog.at_level("WARNING", logger="rlzoo.tasks.prepare"):
        out = gsm8k.prepare(tmp_path / "out", {"source": str(src)})
    assert set(out) == {"train", "test"}
    rows = read(out["train"])
    # the row without "####" is dropped and reported
    assert len(rows) == 2
    assert "dropped 1 of 3" in caplog.text
    assert rows[0]["prompt"] == [
        {
            "role": "user",
            "content": "Tom has 3 apples and buys 4. How many? "
            'Let\'s think step by step and output the final answer after "####".',
        }
    ]
    assert rows[0]["data_source"] == "openai/gsm8k"
    assert rows[0]["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert rows[1]["reward_model"]["ground_truth"] == "2000"  # "2,000" without the separator
    assert rows[0]["extra_info"]["answer"].endswith("#### 7")
    assert rows[0]["extra_info"]["question"] == "Tom has 3 apples and buys 4. How many?"
    assert read(out["test"])[0]["reward_model"]["ground_truth"] == "-6"


def test_gsm8k_config_selects_subfolder(tmp_path: Path) -> None:
    from rlzoo.tasks.prepare import gsm8k

    src = make_gsm8k(tmp_path / "gsm8k")
    out = gsm8k.prepare(tmp_path / "out", {"source": str(src), "config": "socratic", "splits": "test"})
    assert read(out["test"])[0]["extra_info"]["question"].startswith("Socratic: ")
    # without README configs, the config names a sub-folder
    (src / "README.md").unlink()
    out = gsm8k.prepare(tmp_path / "out2", {"source": str(src), "splits": "test"})
    assert not read(out["test"])[0]["extra_info"]["question"].startswith("Socratic")


def test_gsm8k_single_jsonl_file(tmp_path: Path) -> None:
    import json

    from rlzoo.tasks.prepare import gsm8k

    f = tmp_path / "gsm8k_test.jsonl"
    f.write_text(json.dumps({"question": "1+1?", "answer": "2\n#### 2"}) + "\n")
    out = gsm8k.prepare(tmp_path / "out", {"source": str(f), "splits": ["test"]})
    assert read(out["test"])[0]["reward_model"]["ground_truth"] == "2"


def test_final_answer() -> None:
    from rlzoo.tasks.prepare.gsm8k import final_answer

    assert final_answer("a\n#### 72") == "72"
    assert final_answer("#### 1 #### 1,234,567") == "1234567"
    assert final_answer("#### -3.5") == "-3.5"
    assert final_answer("no marker") is None
    assert final_answer("####  ") is None


# ---------------------------------------------------------------------------------------------
# dapo_math / aime2024
# ---------------------------------------------------------------------------------------------
def test_dapo_math_keeps_verl_layout_and_dedups(tmp_path: Path) -> None:
    from rlzoo.tasks.prepare import dapo_math

    src = make_dapo(tmp_path / "dapo" / "data" / "dapo-math-17k.parquet", repeats=3)
    out = dapo_math.prepare(tmp_path / "out", {"source": str(src)})
    rows = read(out["train"])
    assert len(rows) == 3  # 9 rows = 3 prompts x 3 repeats
    expected = dapo_row("Find 1+1.", "2", "uuid-0-0")
    assert rows[0]["prompt"] == expected["prompt"]
    assert rows[0]["reward_model"] == expected["reward_model"]
    assert rows[0]["data_source"] == "math_dapo" and rows[0]["ability"] == "MATH"
    assert rows[0]["extra_info"] == {"index": "uuid-0-0", "split": "train"}
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "10", "9"]

    out = dapo_math.prepare(tmp_path / "all", {"source": str(src.parent.parent), "dedup": False, "limit": 4})
    assert len(read(out["train"])) == 4


def test_aime2024_from_arrow_file_written_as_test(tmp_path: Path) -> None:
    from datasets import Dataset

    from rlzoo.tasks.prepare import aime2024

    rows = [dapo_row("AIME problem one.", "33", "a1"), dapo_row("AIME problem one.", "33", "a1")]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "aime"))
    arrow = next((tmp_path / "aime").glob("*.arrow"))
    out = aime2024.prepare(tmp_path / "out", {"source": str(arrow)})
    assert list(out) == ["test"] and out["test"].name == "test.parquet"
    got = read(out["test"])
    assert len(got) == 2  # repeats kept by default (accuracy averages over them)
    assert got[0]["extra_info"]["split"] == "test"
    assert got[0]["reward_model"]["ground_truth"] == "33"


def test_dapo_wrong_layout_names_columns(tmp_path: Path) -> None:
    from rlzoo.tasks.prepare import dapo_math

    f = tmp_path / "raw.jsonl"
    f.write_text('{"problem": "x", "answer": "1"}\n')
    with pytest.raises(PrepareError, match=r"no column\(s\) 'data_source', 'prompt'.*found problem, answer"):
        dapo_math.prepare(tmp_path / "out", {"source": str(f)})


# ---------------------------------------------------------------------------------------------
# shared behaviour
# ---------------------------------------------------------------------------------------------
def test_missing_split_lists_available(tmp_path: Path) -> None:
    from rlzoo.tasks.prepare import gsm8k

    src = make_gsm8k(tmp_path / "gsm8k")
    with pytest.raises(PrepareError, match=r"split 'validation' is not in .*available splits: train, test"):
        gsm8k.prepare(tmp_path / "out", {"source": str(src), "splits": ["validation"]})


def test_missing_local_path(tmp_path: Path) -> None:
    from rlzoo.tasks.prepare import gsm8k

    with pytest.raises(PrepareError, match="no such file or folder"):
        gsm8k.prepare(tmp_path / "out", {"source": str(tmp_path / "nope.parquet")})


def test_unknown_param_is_a_config_error(tmp_path: Path) -> None:
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.tasks.prepare import gsm8k

    with pytest.raises(ConfigError, match=r"splts: unknown key.*did you mean 'splits'"):
        gsm8k.prepare(tmp_path / "out", {"splts": ["train"]})


def test_split_helpers() -> None:
    assert split_specs("train, test") == [("train", "train"), ("test", "test")]
    assert split_specs(("train:test",)) == [("train", "test")]
    with pytest.raises(PrepareError, match="same file"):
        split_specs(["train:test", "test"])
    assert split_of_file("data/test-00000-of-00001.parquet") == "test"
    assert split_of_file("validation-00000.parquet") == "validation"
    assert split_of_file("gsm8k_val.jsonl") == "validation"
    assert split_of_file("aime-2024.parquet") == "train"


def test_registered_through_the_hook(tmp_path: Path) -> None:
    from rlzoo.kernel.plugins import PluginManager
    from rlzoo.recipe.config import bind_part

    pm = PluginManager(load_entrypoints=False)
    reg = pm.registry("dataset")
    assert {"geometry3k", "gsm8k", "dapo_math", "aime2024"} <= set(reg.names())
    assert "geo3k" in reg  # alias
    for comp in reg:
        assert comp.summary, comp.name
        assert all(f["help"] for f in comp.param_fields()), comp.name
    # the way `rlzoo prepare gsm8k source=... splits=test` calls it
    src = make_gsm8k(tmp_path / "gsm8k")
    problems: list[str] = []
    sel = bind_part(
        "dataset", {"name": "gsm8k", "source": str(src), "splits": "test"}, "prepare", problems, pm
    )
    assert not problems and sel is not None
    out = sel.fn(tmp_path / "out", sel.params)
    assert list(out) == ["test"] and out["test"].exists()


def test_builtin_module_is_import_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, rlzoo.tasks.datasets; "
        "bad = [m for m in ('datasets', 'torch', 'pyarrow', 'transformers') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_gsm8k_row_without_an_answer_is_dropped_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    from rlzoo.tasks.prepare import gsm8k

    f = tmp_path / "gsm8k_test.jsonl"
    rows = [
        {"question": "1+1?", "answer": "2\n#### 2"},
        {"question": "2+2?", "answer": None},  # used to raise TypeError in final_answer
        {"question": None, "answer": "x\n#### 3"},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level("WARNING", logger="rlzoo.tasks.prepare"):
        out = gsm8k.prepare(tmp_path / "out", {"source": str(f), "splits": ["test"]})
    assert [r["reward_model"]["ground_truth"] for r in read(out["test"])] == ["2"]
    assert "dropped 2 of 3" in caplog.text
    assert gsm8k.final_answer(None) is None


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        (
            "train.parquet",
            b"\x8a\x01junk bytes, not parquet" * 40,
            "ArrowInvalid: Parquet magic bytes not found",
        ),
        ("empty.parquet", b"", "ArrowInvalid: Parquet file size is 0 bytes"),
        ("train.json", b"not json{{{\n", "ArrowInvalid: JSON parse error"),
    ],
)
def test_gsm8k_on_junk_input_is_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, reason: str
) -> None:
    """Issue 39, finding 11: ``rlzoo prepare gsm8k`` on a file that is not what its suffix says.
    Before: pyarrow's / datasets' traceback. Also: ``--out`` before ``source=`` (was "unrecognized
    arguments" on Python 3.11)."""
    from rlzoo.cli import main

    junk = tmp_path / name
    junk.write_bytes(content)
    out = tmp_path / "out"
    assert main(["prepare", "gsm8k", "--out", str(out), f"source={junk}"]) == 2
    err = capsys.readouterr().err
    # the last word is rlzoo's one line (not a traceback; datasets' own log lines may come before it)
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"rlzoo prepare: error: {junk}: cannot read it as a dataset ({reason}")
    )
    assert not out.exists()
