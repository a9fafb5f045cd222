"""Check one ``rlzoo train`` run with the vllm rollout backend (scripts/check-vllm-cpu.sh).

Usage: python scripts/check_vllm_run.py RUN_DIR STEPS [MAX_LOG_PPL_DIFF | none]

Fails (exit 1, with the reason) unless ``RUN_DIR/metrics.jsonl`` has a row for every training step
1..STEPS, every step pushed weights (``timing_s/sync_weights``: the loop times every push), and the
trainer's and vLLM's log-probs of the same tokens agree at every step:
``rollout_corr/log_ppl_abs_diff`` (mean over sequences of |log-perplexity difference|) at most MAX_LOG_PPL_DIFF (default 1e-3, an fp32 run; a
push that never reached vLLM shows as a jump after the first update). ``none``: print the values
without a bound (an off-policy runner: tokens from an older version differ by design). Standard
library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEY = "rollout_corr/log_ppl_abs_diff"


def main(run_dir: str, steps: str, limit: str = "1e-3") -> int:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        print(f"check_vllm_run: {path} is missing", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_step = {int(r["step"]): r for r in rows if "step" in r and KEY in r}
    want = range(1, int(steps) + 1)
    problems = [f"step {s}: no row with {KEY}" for s in want if s not in by_step]
    for s in want:
        r = by_step.get(s)
        if r is None:
            continue
        if limit != "none" and float(r[KEY]) > float(limit):
            problems.append(f"step {s}: {KEY} = {r[KEY]:.3g} > {limit}")
    pushes = [r for r in rows if "timing_s/sync_weights" in r]
    if len(pushes) < int(steps):
        problems.append(f"{len(pushes)} rows with timing_s/sync_weights for {steps} steps")
    diffs = ", ".join(f"{by_step[s][KEY]:.2e}" for s in want if s in by_step)
    print(f"check_vllm_run: {run_dir}: {KEY} per step: [{diffs}]")
    for p in problems:
        print(f"check_vllm_run: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
