"""Reward managers under hanging scorers: how long a batch takes and how many samples fail.

    python benchmarks/reward_timeouts.py

Three cases, one table (sleeping scorers: little CPU):

* ``naive`` with 8 samples whose scorer hangs, ``timeout: 1``: ``threads=1`` (the calls one after
  another, as ``naive`` did before issue 23) next to the default ``threads=8`` (each sample on its
  own clock, in parallel).
* ``process_pool`` with 256 samples of 20 ms, 6 of which hang (2 %), 4 workers, ``timeout: 3``:
  before issue 23 the hanging samples held their workers until the batch's deadline and 109 of
  the 256 failed (measured side by side with commit 72b685a); now only the hanging ones fail.
* ``naive`` on 256 real ``math_answer`` verdicts (no hang): the cost of the helper threads.
"""

from __future__ import annotations

import time

from rlzoo.algorithms.functional.reward import BoundScorer, NaiveRewardManager, ProcessPoolRewardManager
from rlzoo.algorithms.reward import NaiveParams, ProcessPoolParams
from rlzoo.algorithms.scorers import MathParams
from rlzoo.kernel.protocols import RewardItem


def hang_on_h(response, ground_truth, data_source, extra_info, params):  # type: ignore[no-untyped-def]
    """Hangs (10 min) on responses starting with 'h', else 20 ms and 1.0."""
    if response.startswith("h"):
        time.sleep(600)
    time.sleep(0.02)
    return 1.0


def _items(responses: list[str]) -> list[RewardItem]:
    return [RewardItem(response=r, ground_truth="1") for r in responses]


def _timed(mgr, responses: list[str]) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    out = mgr(_items(responses))
    return time.monotonic() - t0, sum(r.failed for r in out)


def main() -> None:
    rows: list[tuple[str, str, str, str]] = []
    for threads in (1, 8):
        mgr = NaiveRewardManager(NaiveParams(timeout=1.0, threads=threads), BoundScorer(hang_on_h))
        dt, failed = _timed(mgr, ["h"] * 8)
        rows.append(
            ("naive: 8 hanging samples, timeout 1 s", f"threads={threads}", f"{dt:.2f} s", f"{failed}/8")
        )
    responses = [("h" if i % 50 == 0 else "r") + str(i) for i in range(256)]
    with ProcessPoolRewardManager(
        ProcessPoolParams(num_workers=4, timeout=3.0), BoundScorer(hang_on_h)
    ) as pool:
        pool.start()
        dt, failed = _timed(pool, responses)
    rows.append(
        ("process_pool: 256 x 20 ms, 6 hang, timeout 3 s", "num_workers=4", f"{dt:.2f} s", f"{failed}/256")
    )
    scorer = BoundScorer("rlzoo.algorithms.functional.scoring.math_answer:compute_score", MathParams())
    math = [f"so \\boxed{{{i % 7}}}" for i in range(256)]
    for threads in (1, 8):
        mgr = NaiveRewardManager(NaiveParams(timeout=60.0, threads=threads), scorer)
        mgr(_items(math[:8]))  # warm
        best = min(_timed(mgr, math)[0] for _ in range(5))
        rows.append(
            (
                "naive: 256 math_answer verdicts (best of 5)",
                f"threads={threads}",
                f"{best * 1000:.1f} ms",
                "0/256",
            )
        )
    header = ("case", "setting", "batch time", "failed")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(4)]
    for r in (header, *rows):
        print(" | ".join(c.ljust(widths[i]) for i, c in enumerate(r)))


if __name__ == "__main__":
    main()
