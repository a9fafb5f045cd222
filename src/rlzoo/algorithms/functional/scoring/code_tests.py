"""The ``code_tests`` scorer: run the response's code against the row's tests in the sandbox.

Tests (the row's ``reward_model.ground_truth``, a mapping or its JSON text):

- ``{"fn_name": "f", "inputs": [...], "outputs": [...]}`` (verl's ``prime_code`` rows): call ``f``
  (or ``Solution().f``) with each input's arguments (a list, or a text of one JSON value per line)
  and compare the result with the output (a value or its JSON text; tuples compare as lists, and an
  output wrapped in a one-item list matches too, as prime_code allows);
- ``{"inputs": [...], "outputs": [...]}`` without ``fn_name``: stdin / stdout pairs, the program run
  once per pair, its stdout compared with trailing whitespace of each line and trailing blank lines
  ignored;
- ``{"asserts": ["assert f(1) == 2", ...], "setup": "..."}``, a list of such strings, or a text
  whose top-level ``assert`` lines are the tests (the other lines run first as setup).

A mapping may add ``prefix``: source the response's code completes (HumanEval style, e.g.
``def f(x):\n    return ``), put before it.

Function and assert tests run in one execution: a harness compiles the code, runs it, then each
test under its own alarm, and reports each verdict on a line tagged with a random nonce. The code
runs in the harness's process: it cannot leave the sandbox, but code written to forge the verdict
lines (by reading the harness) could; docs/code.md says so.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from rlzoo.sandbox import sandbox_for
from rlzoo.sandbox.run import CodeRunner, Execution, Outcome

from ...scorers import CodeTestsParams

#: the counted outcomes of one test (reward parts: each count is a metric)
OUTCOMES = ("passed", "wrong_answer", "runtime_error", "timeout", "compile_error")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*)\Z", re.DOTALL)


def extract_code(response: str) -> str:
    """The last ```python (or ```py, or unlabelled) fenced block; an unclosed last fence runs to the
    end (a response cut at the length limit); without fences the whole response (bare code)."""
    blocks = [
        body for lang, body in _FENCE.findall(response) if lang.lower() in ("python", "python3", "py", "")
    ]
    if blocks:
        return blocks[-1]
    tail = response.split("```")
    if len(tail) % 2 == 0:  # an odd number of fences: the last one is open
        opened = _OPEN_FENCE.search("```" + tail[-1])
        if opened:
            return opened.group(1)
    return response


def parse_tests(ground_truth: Any) -> dict[str, Any]:
    """The row's tests as ``{"kind": "function" | "stdio" | "assert", ...}``; ValueError says what is accepted."""
    truth = ground_truth
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except ValueError:
            return _assert_text(truth)
    if isinstance(truth, (list, tuple)) and all(isinstance(t, str) for t in truth):
        return {"kind": "assert", "setup": "", "cases": list(truth)}
    if isinstance(truth, Mapping):
        if "asserts" in truth:
            return {
                "kind": "assert",
                "setup": str(truth.get("setup") or ""),
                "cases": [str(t) for t in truth["asserts"]],
            }
        if "inputs" in truth and "outputs" in truth:
            inputs, outputs = list(truth["inputs"]), list(truth["outputs"])
            if len(inputs) != len(outputs):
                raise ValueError(f"code tests: {len(inputs)} inputs but {len(outputs)} outputs")
            prefix = {"prefix": str(truth["prefix"])} if truth.get("prefix") else {}
            if truth.get("fn_name"):
                cases = [[i, o] for i, o in zip(inputs, outputs)]
                return {"kind": "function", "fn_name": str(truth["fn_name"]), "cases": cases, **prefix}
            return {
                "kind": "stdio",
                "cases": [[_text(i), _text(o)] for i, o in zip(inputs, outputs)],
                **prefix,
            }
    raise ValueError(
        "code tests must be {'fn_name', 'inputs', 'outputs'} (prime_code), {'inputs', 'outputs'} (stdin/stdout), "
        f"{{'asserts': [...]}}, a list of assert strings or a text of assert lines; got {type(ground_truth).__name__}"
    )


def _text(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else "\n".join(map(str, value))
        if isinstance(value, list)
        else str(value)
    )


def _assert_text(text: str) -> dict[str, Any]:
    setup: list[str] = []
    cases: list[str] = []
    for line in text.splitlines():
        (cases if line.startswith("assert") else setup).append(line)
    if not cases:
        raise ValueError("code tests given as text must hold top-level 'assert ...' lines")
    return {"kind": "assert", "setup": "\n".join(setup), "cases": cases}


def normalize_stdout(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


# The harness: compiles solution.py, runs it, then each test under its own alarm; one verdict line
# per test, tagged with the nonce, on a copy of stdout the solution's prints do not reach.
HARNESS = r"""
import io, json, os, signal, sys
NONCE = %(nonce)r
OUT = os.dup(1)
def report(i, verdict, detail=""):
    os.write(OUT, (json.dumps([NONCE, i, verdict, str(detail)[:200]]) + "\n").encode())
class TestTimeout(BaseException):
    pass
def alarm(signum, frame):
    raise TestTimeout()
signal.signal(signal.SIGALRM, alarm)
LIMIT = %(test_timeout)r
spec = json.load(open("tests.json"))
src = open("solution.py").read()
try:
    code = compile(src, "solution.py", "exec")
except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
    report(-1, "compile_error", repr(e))
    sys.exit(0)
sys.stdout = io.StringIO()
sys.stdin = io.StringIO()
ns = {"__name__": "solution"}
def timed(fn):
    signal.setitimer(signal.ITIMER_REAL, LIMIT)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
try:
    timed(lambda: exec(code, ns))
    if spec.get("setup"):
        timed(lambda: exec(compile(spec["setup"], "setup", "exec"), ns))
except TestTimeout:
    report(-1, "timeout", "the code's top level")
    sys.exit(0)
except BaseException as e:
    report(-1, "runtime_error", repr(e))
    sys.exit(0)
def plain(v):
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    return v
def loads(v):
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v
def args_of(v):
    if isinstance(v, list):
        return v
    return [json.loads(line) for line in str(v).split("\n") if line.strip()]
def call(name):
    fn = ns.get(name)
    if fn is None and "Solution" in ns:
        fn = getattr(ns["Solution"](), name)
    if fn is None:
        raise NameError("the code defines no function %%r" %% name)
    return fn
for i, case in enumerate(spec["cases"]):
    try:
        if spec["kind"] == "assert":
            timed(lambda: exec(compile(case, "test%%d" %% i, "exec"), ns))
            verdict = "passed"
        else:
            got = plain(timed(lambda: call(spec["fn_name"])(*args_of(case[0]))))
            want = plain(loads(case[1]))
            ok = got == want or (isinstance(want, list) and len(want) == 1 and got == want[0])
            verdict = "passed" if ok else "wrong_answer"
        report(i, verdict)
    except TestTimeout:
        report(i, "timeout")
    except AssertionError as e:
        report(i, "wrong_answer", repr(e))
    except BaseException as e:
        report(i, "runtime_error", repr(e))
"""

STDIO_HARNESS = r"""
import json, os, sys
try:
    code = compile(open("solution.py").read(), "solution.py", "exec")
except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
    os.write(1, (json.dumps([%(nonce)r, -1, "compile_error", repr(e)[:200]]) + "\n").encode())
    sys.exit(0)
exec(code, {"__name__": "__main__"})
"""


def _verdicts(ex: Execution, nonce: str, n: int) -> tuple[list[str], str]:
    """Per-test verdicts from the harness's tagged lines; tests without one get the execution's fate."""
    found: dict[int, str] = {}
    note = ""
    for line in ex.stdout.splitlines():
        if nonce not in line:
            continue
        try:
            tag, i, verdict, detail = json.loads(line)
        except ValueError:
            continue
        if tag != nonce or verdict not in OUTCOMES:
            continue
        if i == -1:
            return [verdict] * n, str(detail)
        found[int(i)] = verdict
    fate = "timeout" if ex.outcome is Outcome.TIMEOUT else "runtime_error"
    if len(found) < n:
        note = (
            f"the run ended ({ex.outcome.value}) with {n - len(found)} tests unreported: {ex.stderr[-200:]}"
        )
    return [found.get(i, fate) for i in range(n)], note


def run_tests(
    code: str, tests: Mapping[str, Any], params: CodeTestsParams, box: CodeRunner | None = None
) -> tuple[list[str], str]:
    """One verdict per test (``OUTCOMES``) and a note for the log; ``code`` runs in ``box`` (default:
    the shared sandbox of ``params.sandbox``)."""
    box = box or sandbox_for(params.sandbox)
    cases = list(tests["cases"])
    if params.max_tests:
        cases = cases[: params.max_tests]
    if not cases:
        raise ValueError("code tests: the row has no tests")
    nonce = secrets.token_hex(16)
    if tests["kind"] == "stdio":
        harness = STDIO_HARNESS % {"nonce": nonce}
        files = {"solution.py": code}
        runs = box.map(
            [
                {"code": harness, "stdin": i, "files": files, "timeout_s": params.test_timeout_s}
                for i, _ in cases
            ]
        )
        verdicts = []
        for ex, (_, want) in zip(runs, cases):
            if nonce in ex.stdout and "compile_error" in ex.stdout:
                return ["compile_error"] * len(cases), ex.stdout[-200:]
            if ex.outcome is Outcome.TIMEOUT:
                verdicts.append("timeout")
            elif not ex.ok:
                verdicts.append("runtime_error")
            else:
                verdicts.append(
                    "passed" if normalize_stdout(ex.stdout) == normalize_stdout(want) else "wrong_answer"
                )
        return verdicts, ""
    spec = {**tests, "cases": cases}
    harness = HARNESS % {"nonce": nonce, "test_timeout": params.test_timeout_s}
    files = {"solution.py": code, "tests.json": json.dumps(spec)}
    ex = box.run(harness, files=files)
    return _verdicts(ex, nonce, len(cases))


_cache: OrderedDict[str, list[str]] = OrderedDict()
_cache_lock = threading.Lock()


def _cached_verdicts(code: str, tests: Mapping[str, Any], params: CodeTestsParams) -> list[str]:
    """``run_tests``, remembered for the last ``params.cache_size`` (code, tests, params): a group of
    samples often holds the same response several times, and each ran once is enough."""
    if not params.cache_size:
        return run_tests(code, tests, params)[0]
    key = json.dumps([code, tests, repr(params)], sort_keys=True)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return list(_cache[key])
    verdicts, _ = run_tests(code, tests, params)
    with _cache_lock:
        _cache[key] = list(verdicts)
        while len(_cache) > params.cache_size:
            _cache.popitem(last=False)
    return verdicts


def compute_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: CodeTestsParams
) -> dict[str, Any]:
    """``score`` = the fraction of tests passed (``all_or_nothing``: 1.0 only when all pass); ``acc``
    1.0 when all pass; one count per outcome (``passed``, ``wrong_answer``, ``runtime_error``,
    ``timeout``, ``compile_error``) and ``tests``."""
    tests = parse_tests(ground_truth)
    code = tests.get("prefix", "") + extract_code(response)
    verdicts = _cached_verdicts(code, tests, params)
    counts = {o: float(verdicts.count(o)) for o in OUTCOMES}
    n = len(verdicts)
    passed = counts["passed"] / n
    score = float(passed == 1.0) if params.all_or_nothing else passed
    return {"score": score, "acc": float(passed == 1.0), "tests": float(n), **counts}
