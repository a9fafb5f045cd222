"""The code tasks: generated functions with hidden tests, the verl-layout loader, the environment and the
python tool, all running code through the sandbox; and quickstart_code learns (held-out validation)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rlzoo
from rlzoo.algorithms.functional.scoring.code_tests import compute_score
from rlzoo.algorithms.scorers import CodeTestsParams
from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import AgentTurn
from rlzoo.report.metrics import read_metrics
from rlzoo.sandbox.params import SandboxParams
from rlzoo.tasks._python_functions import (
    expressions,
    make_environment,
    make_python_tool,
    prepare,
    prepare_verl_code,
    value,
)
from rlzoo.tasks.python_functions import (
    PythonFunctionsDataParams,
    PythonFunctionsEnvParams,
    PythonToolParams,
    VerlCodeParams,
)

TESTS = CodeTestsParams(sandbox=SandboxParams(require=()), cache_size=0)


def test_values_follow_pythons_precedence() -> None:
    assert value(("x", "*", "3", "+", "2"), 4) == 14  # 4*3 + 2
    assert value(("x", "-", "2", "*", "3"), 5) == -1  # 5 - 6
    assert value(("x", "+", "7"), -9) == -2
    assert value(("8",), 123) == 8
    assert len(expressions(2, "+-*")) == 30 and len(expressions(3, "+")) == 100


@pytest.fixture(scope="module")
def level2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("python_functions")
    prepare(out, PythonFunctionsDataParams(level=2, train_size=64, val_size=6, hidden_size=16, num_layers=1))
    return out


def test_validation_is_held_out_and_the_reference_body_passes(level2: Path) -> None:
    train = pq.read_table(level2 / "train.parquet").to_pylist()
    val = pq.read_table(level2 / "val.parquet").to_pylist()
    exprs = lambda rows: {r["extra_info"]["expression"] for r in rows}  # noqa: E731
    assert len(val) == 6 and not exprs(train) & exprs(val)
    for r in val[:3]:
        truth = r["reward_model"]["ground_truth"]
        assert r["prompt"][0]["content"] == "f ( x ) = " + r["extra_info"]["expression"]
        assert (
            compute_score(r["extra_info"]["expression"], truth, r["data_source"], {}, TESTS)["score"] == 1.0
        )
        assert compute_score("x + 100", truth, r["data_source"], {}, TESTS)["score"] == 0.0


def _verl_rows() -> list[dict]:
    good = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    fn = {"fn_name": "twice", "inputs": ["3", "4"], "outputs": ["6", "8"]}
    prompt = lambda t: [{"role": "user", "content": t}]  # noqa: E731
    return [
        {
            "data_source": "codecontests",
            "prompt": prompt("add"),
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(good)},
            "extra_info": {"index": 0},
        },
        {
            "data_source": "apps",
            "prompt": prompt("twice"),
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(fn)},
            "extra_info": {"index": 1},
        },
        {
            "data_source": "apps",
            "prompt": prompt("broken"),
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": json.dumps({"nothing": 1})},
            "extra_info": {"index": 2},
        },
    ]


def test_verl_code_loader_keeps_readable_rows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "code.parquet"
    pq.write_table(pa.Table.from_pylist(_verl_rows()), src)
    files = prepare_verl_code(tmp_path / "out", VerlCodeParams(train_files=(str(src),), val_size=1))
    train = pq.read_table(files["train"]).to_pylist()
    val = pq.read_table(files["val"]).to_pylist()
    assert len(train) + len(val) == 2 and "1 of 3 train rows dropped" in caplog.text
    assert {r["data_source"] for r in train + val} == {"codecontests", "apps"}
    with pytest.raises(RlzooError, match="needs train_files"):
        prepare_verl_code(tmp_path / "x", VerlCodeParams())


def test_the_environment_runs_the_tests_and_gives_feedback() -> None:
    truth = json.dumps(
        {"fn_name": "f", "inputs": ["1", "2"], "outputs": ["2", "4"], "prefix": "def f(x):\n    return "}
    )
    row = {
        "prompt": [{"role": "user", "content": "f ( x ) = x * 2"}],
        "reward_model": {"ground_truth": truth},
    }
    env = make_environment(PythonFunctionsEnvParams(tests=TESTS, max_attempts=2))

    async def episode(*answers: str) -> list:
        env.reset(row)
        return [await env.step(AgentTurn(text=a, turn=i)) for i, a in enumerate(answers)]

    first, second = asyncio.run(episode("x + 1", "x * 2"))
    # x + 1 at 1 -> 2 (passes), at 2 -> 3 (wrong): 1 of 2
    assert (
        not first.done and first.messages[0]["content"] == "1 of 2 tests passed; first failure: wrong_answer"
    )
    assert second.done and second.reward == 1.0 and second.info["acc"] == 1.0
    (only,) = asyncio.run(episode("x +"))
    assert not only.done and "compile_error" in only.messages[0]["content"]


def test_the_python_tool_runs_in_the_sandbox() -> None:
    tool = make_python_tool(PythonToolParams(sandbox=SandboxParams(require=(), timeout_s=2.0)))
    assert asyncio.run(tool.call({"code": "print(6 * 7)"})) == "42\n"
    reply = asyncio.run(tool.call({"code": "import os; print(os.environ.get('HOME')); 1/0"}))
    assert reply.startswith("/") and "ZeroDivisionError" in reply and reply.endswith("[error]")
    with pytest.raises(ValueError, match="string 'code'"):
        asyncio.run(tool.call({"source": "print(1)"}))


@pytest.mark.slow
def test_quickstart_code_learns(tmp_path: Path) -> None:
    """40 steps of the default recipe (level 1): greedy validation from 0 / 10 functions right to >= 5 / 10
    (measured: 0.0 at step 0, 0.5 at step 30 with the recipe's seed; docs/code.md has the curve)."""
    run = rlzoo.build_run(
        "quickstart_code",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            "run.progress=false",
            "trainer.total_steps=40",
            "trainer.test_freq=40",
        ],
    )
    run.train()
    recs = read_metrics(run.run_dir)
    assert recs[0]["step"] == 0 and recs[0]["val/mean"] <= 0.2
    assert recs[-1]["step"] == 40 and recs[-1]["val/mean"] >= 0.5, [r.get("val/mean") for r in recs]
