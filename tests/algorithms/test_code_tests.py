"""The code_tests scorer: code from the response, run against the row's tests in the sandbox, partial
credit, and each failure counted as its own outcome (expected counts worked out by hand per case)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sandbox.fusion_standin import fusion_standin

from rlzoo.algorithms.functional.scoring.code_tests import compute_score, extract_code, parse_tests
from rlzoo.algorithms.scorers import CodeTestsParams
from rlzoo.sandbox.params import SandboxParams

PARAMS = CodeTestsParams(sandbox=SandboxParams(require=(), timeout_s=5.0), test_timeout_s=0.5)
# verl prime_code layout: fn_name, inputs as one JSON value per line, outputs as JSON text
PRIME = json.dumps(
    {"fn_name": "add", "inputs": ["1\n2", "[3]\n[4]", "5\n6"], "outputs": ["3", "[3, 4]", "11"]}
)
STDIO = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7"]}
ASSERTS = "def helper(x):\n    return x\nassert sq(2) == 4\nassert sq(3) == 10\nassert sq(helper(-1)) == 1"


def counts(result: dict[str, Any]) -> tuple[float, ...]:
    return tuple(result[k] for k in ("passed", "wrong_answer", "runtime_error", "timeout", "compile_error"))


@pytest.mark.parametrize(
    ("response", "truth", "score", "expected"),
    [
        ("```python\ndef add(a, b):\n    return a + b\n```", PRIME, 1.0, (3, 0, 0, 0, 0)),
        # 1-2 != 3; [3]-[4] raises TypeError; 5-6 != 11
        ("def add(a, b): return a - b", PRIME, 0.0, (0, 2, 1, 0, 0)),
        ("def add(a, b:\n", PRIME, 0.0, (0, 0, 0, 0, 3)),
        ("def add(a, b):\n    while True: pass", PRIME, 0.0, (0, 0, 0, 3, 0)),
        ("import os\nos._exit(0)", PRIME, 0.0, (0, 0, 3, 0, 0)),  # leaving early passes nothing
        ("class Solution:\n    def add(self, a, b):\n        return a + b", PRIME, 1.0, (3, 0, 0, 0, 0)),
        ("a, b = map(int, input().split())\nprint(a + b)", STDIO, 1.0, (2, 0, 0, 0, 0)),
        ("print(3)", STDIO, 0.5, (1, 1, 0, 0, 0)),
        ("print(3", STDIO, 0.0, (0, 0, 0, 0, 2)),
        ("import time\ntime.sleep(5)", STDIO, 0.0, (0, 0, 0, 2, 0)),
        ("Sure:\n```py\ndef sq(x):\n    return x*x\n```\nDone.", ASSERTS, 2 / 3, (2, 1, 0, 0, 0)),
    ],
)
def test_outcomes_are_counted(response: str, truth: Any, score: float, expected: tuple[int, ...]) -> None:
    result = compute_score(response, truth, "code", {}, PARAMS)
    assert result["score"] == pytest.approx(score) and counts(result) == expected, result
    assert result["acc"] == float(score == 1.0) and result["tests"] == sum(expected)


def test_all_or_nothing() -> None:
    params = CodeTestsParams(sandbox=PARAMS.sandbox, all_or_nothing=True)
    assert compute_score("print(3)", STDIO, "code", {}, params)["score"] == 0.0


def test_code_extraction() -> None:
    assert extract_code("text\n```python\nx = 1\n```\nmore\n```python\nx = 2\n```") == "x = 2\n"
    assert extract_code("```\nx = 3\n```") == "x = 3\n"
    assert extract_code("```bash\nls\n```\nx = 4") == "```bash\nls\n```\nx = 4"  # no python block: bare
    assert extract_code("start\n```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off
    assert extract_code("x = 5") == "x = 5"


def test_bad_tests_are_named() -> None:
    with pytest.raises(ValueError, match="prime_code"):
        parse_tests({"cases": []})
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        parse_tests({"inputs": ["1", "2"], "outputs": ["1"]})
    assert parse_tests(["assert f() == 1"])["kind"] == "assert"


def test_the_remote_option_scores_like_the_local_one() -> None:
    with fusion_standin(SandboxParams(require=(), timeout_s=5.0)) as url:
        remote = CodeTestsParams(sandbox=SandboxParams(url=url, timeout_s=5.0), test_timeout_s=0.5)
        for response, truth in [("def add(a, b): return a - b", PRIME), ("print(3)", STDIO)]:
            assert counts(compute_score(response, truth, "code", {}, remote)) == counts(
                compute_score(response, truth, "code", {}, PARAMS)
            )
