"""Sandbox throughput: a batch of 64 responses x 10 tests scored by ``code_tests``, and the cost of one
execution in each isolation mode against a bare ``python -c`` subprocess.

Prints one table. The responses are functions of ``python_functions`` level 2 (a third right, a
third wrong, a third raising), each against its row's 10 tests (one sandboxed execution per response
runs all 10); the scorer's cache is off so every response runs.

    python benchmarks/sandbox.py [--repeat N] [--parallel K]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from rlzoo.algorithms.functional.scoring.code_tests import compute_score
from rlzoo.algorithms.scorers import CodeTestsParams
from rlzoo.sandbox.params import SandboxParams
from rlzoo.sandbox.run import Sandbox
from rlzoo.tasks._python_functions import PREFIX, expressions, row


def bare(n: int) -> float:
    """Seconds per bare ``python -c pass`` subprocess (the floor of any process-based sandbox)."""
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-I", "-c", "pass"], check=True, capture_output=True)
    return (time.perf_counter() - start) / n


def sandboxed(box: Sandbox, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        assert box.run("pass").ok
    return (time.perf_counter() - start) / n


def batch(parallel: int) -> tuple[float, float]:
    """(seconds, mean score) to score 64 responses x 10 tests with ``parallel`` scorer threads."""
    rng = random.Random(0)
    exprs = expressions(2, "+-*")
    rows = [row(rng.choice(exprs), "bench", i, 10, rng) for i in range(64)]
    responses = []
    for i, r in enumerate(rows):
        body = r["extra_info"]["expression"]
        responses.append([body, "x + 100", "x / 0"][i % 3])
    params = CodeTestsParams(sandbox=SandboxParams(max_parallel=parallel), cache_size=0)
    compute_score("1", rows[0]["reward_model"]["ground_truth"], "", {}, params)  # build the sandbox
    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(
            pool.map(
                lambda a: compute_score(a[0], a[1]["reward_model"]["ground_truth"], "", {}, params),
                zip(responses, rows),
            )
        )
    took = time.perf_counter() - start
    assert json.loads(rows[0]["reward_model"]["ground_truth"])["prefix"] == PREFIX
    return took, statistics.mean(r["score"] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="executions per overhead measurement")
    ap.add_argument(
        "--parallel", type=int, default=os.cpu_count() or 1, help="sandbox slots and scorer threads"
    )
    args = ap.parse_args()
    floor = bare(args.repeat)
    rows = [("bare python -c (subprocess.run)", floor, "")]
    for isolation in ("rlimits", "auto"):
        box = Sandbox(SandboxParams(isolation=isolation, require=()))  # type: ignore[arg-type]
        per = sandboxed(box, args.repeat)
        rows.append((f"sandbox {box.protections.mode}", per, f"+{(per - floor) * 1000:.0f} ms"))
    took, mean = batch(args.parallel)
    print(f"{'execution':40s} {'s each':>8s} {'overhead':>10s}")
    for name, sec, extra in rows:
        print(f"{name:40s} {sec:8.3f} {extra:>10s}")
    print(
        f"{'64 responses x 10 tests (code_tests)':40s} {took:8.2f} s total, {took / 64 * 1000:.0f} ms per response, "
        f"{args.parallel} slots, mean score {mean:.3f} (expected 22/64 = 0.344: rows 0, 3, .. answered right)"
    )


if __name__ == "__main__":
    main()
