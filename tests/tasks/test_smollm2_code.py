"""The ``smollm2_code`` dataset (python_functions phrased for SmolLM2): prompts and meanings worked
out by hand, the held-out split, hand-written answers scored by ``code_tests`` in the sandbox, and
the ``smollm2_code`` recipe for two steps on a tiny GGUF standing in for SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rlzoo
from rlzoo.algorithms.functional.scoring.code_tests import compute_score
from rlzoo.algorithms.scorers import CodeTestsParams
from rlzoo.report.metrics import read_metrics
from rlzoo.sandbox.params import SandboxParams
from rlzoo.tasks._smollm2 import code_prompt, in_order, prepare_code
from rlzoo.tasks.smollm2 import SmolLM2CodeParams

EXPR = ("x", "+", "4", "*", "3")
TESTS = CodeTestsParams(sandbox=SandboxParams(require=()), cache_size=0)


def test_prompts_state_the_body_in_each_style() -> None:
    tail = " Reply with only the function in a ```python code block."
    assert code_prompt(EXPR, "code") == "Write a Python function f(x) that returns x + 4 * 3." + tail
    assert code_prompt(EXPR, "words") == "Write a Python function f(x) that returns x plus 4 times 3." + tail
    assert code_prompt(EXPR, "steps") == (
        "Write a Python function f(x) that takes x, adds 4, then multiplies by 3, and returns the result."
        + tail
    )


def test_steps_apply_in_order() -> None:
    assert in_order(EXPR, 2) == 18  # (2 + 4) * 3, where Python's precedence gives 2 + 12 = 14
    assert in_order(("x", "-", "5", "-", "2"), -1) == -8
    assert in_order(("x", "*", "2", "-", "7"), 3) == -1
    assert in_order(("x", "*", "0"), 9) == 0


def test_params_name_the_bad_knob() -> None:
    with pytest.raises(ValueError, match="style must be 'code', 'words' or 'steps'"):
        SmolLM2CodeParams(style="prose")
    with pytest.raises(ValueError, match="ops must be a non-empty subset"):
        SmolLM2CodeParams(ops="/")


def test_dataset_holds_out_validation_and_tests_follow_the_style(tmp_path: Path, gguf_file: Path) -> None:
    params = SmolLM2CodeParams(style="steps", train_size=200, val_size=20, gguf_file=str(gguf_file))
    files = prepare_code(tmp_path, params)
    train, val = (pq.read_table(files[k]).to_pylist() for k in ("train", "val"))
    assert (len(train), len(val)) == (200, 20)
    val_exprs = {r["extra_info"]["expression"] for r in val}
    assert len(val_exprs) == 20 and not val_exprs & {r["extra_info"]["expression"] for r in train}
    assert (files["model"] / "config.json").exists()
    for r in val:
        words = tuple(r["extra_info"]["expression"].split())
        truth = json.loads(r["reward_model"]["ground_truth"])
        assert truth["fn_name"] == "f" and len(truth["inputs"]) == 5
        # each expected output is the steps applied to the input by hand, left to right
        for x, y in zip(truth["inputs"], truth["outputs"]):
            acc = int(x)
            for op, d in zip(words[1::2], words[2::2]):
                acc = acc + int(d) if op == "+" else acc - int(d) if op == "-" else acc * int(d)
            assert int(y) == acc


def test_a_correct_function_passes_and_the_precedence_slip_fails() -> None:
    # (x + 4) * 3 by hand: 2 -> 18, -1 -> 9, 0 -> 12
    truth = json.dumps({"fn_name": "f", "inputs": ["2", "-1", "0"], "outputs": ["18", "9", "12"]})
    right = "```python\ndef f(x):\n    return (x + 4) * 3\n```\nThis adds 4, then multiplies."
    slip = "```python\ndef f(x):\n    return x + 4 * 3\n```"  # 14, 11, 12: only x = 0 agrees
    source = "rlzoo/python_functions"
    got = compute_score(right, truth, source, {}, TESTS)
    assert got["score"] == 1.0 and got["acc"] == 1.0
    got = compute_score(slip, truth, source, {}, TESTS)
    assert got["score"] == pytest.approx(1 / 3) and got["acc"] == 0.0 and got["wrong_answer"] == 2.0


def test_recipe_runs_two_steps_on_a_tiny_gguf(tmp_path: Path, gguf_file: Path) -> None:
    run = rlzoo.build_run(
        "smollm2_code",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            f"+data.prepare.gguf_file={gguf_file}",
            "data.prepare.train_size=16",
            "data.prepare.val_size=2",
            "data.max_prompt_length=256",
            "data.max_response_length=8",
            "data.train_batch_size=2",
            "rollout.n=2",
            "trainer.ppo_mini_batch_size=2",
            "trainer.total_steps=2",
            "trainer.test_freq=-1",
            "run.progress=false",
        ],
    )
    run.train()
    recs = read_metrics(run.run_dir)
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert "val/mean" in recs[0] and "val/mean" in recs[-1]
    for r in recs[1:]:  # a random tiny model writes no passing function; the step still runs
        assert 0.0 <= r["critic/score/mean"] <= 1.0 and r["response_length/mean"] > 0
