"""The ``python_file`` scorer (verl's ``custom_reward_function``): checked without running the file,
called with verl's keywords, loaded from its path only, and a whole run trains with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlzoo.algorithms.functional.scoring import user_file
from rlzoo.algorithms.scorers import PythonFileParams
from rlzoo.kernel.errors import RlzooError
from rlzoo.recipe.config import load_config

VERL_STYLE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    words = solution_str.split()
    acc = float(bool(words) and words[0] == str(ground_truth))
    return {"score": acc + bonus, "acc": acc, "source": data_source, "split": (extra_info or {}).get("split")}
"""


def write(tmp_path: Path, text: str, name: str = "my_reward.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "function", "kwargs", "message"),
    [
        (None, "compute_score", {}, r"path '.*nowhere.py' does not exist; give the Python file"),
        ("def compute_score(:\n", "compute_score", {}, r"is not Python that parses: .*\(line 1\)"),
        (
            VERL_STYLE,
            "score_it",
            {},
            r"defines no top-level function 'score_it' \(its functions: \['compute_score'\]\)",
        ),
        (
            "def compute_score(response, answer):\n    return 1.0\n",
            "compute_score",
            {},
            r"does not accept the keyword\(s\) \['data_source', 'solution_str', 'ground_truth', 'extra_info'\]",
        ),
        (
            "def compute_score(data_source, solution_str, ground_truth, extra_info, tokenizer):\n    return 1\n",
            "compute_score",
            {},
            r"requires \['tokenizer'\], which verl's call does not pass",
        ),
        (VERL_STYLE, "compute_score", {"malus": 1}, r"does not accept the keyword\(s\) \['malus'\]"),
        (
            "async def compute_score(**kw):\n    return 1\n",
            "compute_score",
            {},
            r"is async; a scoring function is called synchronously",
        ),
    ],
)
def test_what_verl_cannot_call_is_refused_at_validate(tmp_path, text, function, kwargs, message):
    path = tmp_path / "nowhere.py" if text is None else write(tmp_path, text)
    with pytest.raises(ValueError, match=message):
        PythonFileParams(path=str(path), function=function, kwargs=kwargs)


def test_validating_runs_nothing_in_the_file(tmp_path):
    marker = tmp_path / "ran"
    path = write(tmp_path, f"open({str(marker)!r}, 'w').write('x')\n" + VERL_STYLE)
    PythonFileParams(path=str(path))
    ok = write(tmp_path, "def compute_score(**kwargs):\n    return 0.5\n", "kw.py")
    PythonFileParams(path=str(ok), kwargs={"anything": 1})  # **kwargs takes every keyword
    assert not marker.exists()


def test_called_with_verl_keywords_and_its_kwargs(tmp_path):
    params = PythonFileParams(path=str(write(tmp_path, VERL_STYLE)), kwargs={"bonus": 0.5})
    out = user_file.compute_score("7 8", 7, "rlzoo/quickstart", {"split": "train"}, params)
    assert out == {"score": 1.5, "acc": 1.0, "source": "rlzoo/quickstart", "split": "train"}
    assert user_file.compute_score("8", 7, "s", {}, params)["score"] == 0.5


def test_loaded_from_its_path_only_two_files_of_one_name_stay_apart(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write(tmp_path / "a", "def compute_score(**k):\n    return 0.25\n", "json.py")
    b = write(tmp_path / "b", "def compute_score(**k):\n    return 0.75\n", "json.py")
    assert user_file.compute_score("", 0, "", {}, PythonFileParams(path=str(a))) == 0.25
    assert user_file.compute_score("", 0, "", {}, PythonFileParams(path=str(b))) == 0.75
    assert json.dumps({"x": 1}) == '{"x": 1}'  # the standard library's json was not replaced


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return float('nan')", r"returned score nan; a finite number is needed"),
        ("return {'acc': 1.0}", r"returned a dict without 'score'"),
        ("return 'high'", r"returned score 'high'"),
    ],
)
def test_a_wrong_return_is_a_scorer_failure(tmp_path, body, message):
    params = PythonFileParams(path=str(write(tmp_path, f"def compute_score(**k):\n    {body}\n")))
    with pytest.raises(ValueError, match=message):
        user_file.compute_score("x", 1, "s", {}, params)


def test_a_recipe_names_the_file_and_a_run_trains_with_it(tmp_path, quickstart_dir):
    import rlzoo

    path = write(tmp_path, VERL_STYLE)
    bad = ["reward.scorer.name=python_file", f"reward.scorer.path={tmp_path / 'missing.py'}"]
    with pytest.raises(RlzooError, match=r"reward.scorer.*missing.py' does not exist"):
        load_config("quickstart", bad)
    run = rlzoo.build_run(
        "quickstart",
        [
            f"data.dir={quickstart_dir}",
            f"run.output_dir={tmp_path / 'run'}",
            "run.loggers=[jsonl]",
            "run.progress=false",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.total_steps=2",
            "reward.scorer.name=python_file",
            f"reward.scorer.path={path}",
        ],
    )
    run.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all(r["reward/failed_frac"] == 0.0 for r in rows)
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 for r in rows)
