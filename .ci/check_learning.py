"""CI check of the README's first command: it printed a run directory whose metrics show learning.

Usage: python3 .ci/check_learning.py LOG_FILE
Reads the run directory from the log line ``rlzoo: run directory PATH`` and compares the reward
(``critic/score/mean``) of the first and last fifth of the steps in ``metrics.jsonl``. Standard
library only: it runs outside any venv.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

KEY = "critic/score/mean"
MIN_GAIN = 0.2  # absolute reward gain, last fifth vs first fifth of the steps


def main(log_file: str) -> int:
    text = Path(log_file).read_text(errors="replace")
    m = re.search(r"rlzoo: run directory (\S+)", text)
    if not m:
        print(f"check: no 'rlzoo: run directory' line in {log_file}", file=sys.stderr)
        return 1
    metrics = Path(m.group(1)) / "metrics.jsonl"
    if not metrics.is_file():
        print(f"check: {metrics} is missing", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rewards = [float(r[KEY]) for r in rows if KEY in r]
    if len(rewards) < 10:
        print(f"check: only {len(rewards)} steps with {KEY} in {metrics}", file=sys.stderr)
        return 1
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    print(f"check: {len(rewards)} steps; {KEY} first fifth {first:.3f} -> last fifth {last:.3f}")
    if last < first + MIN_GAIN:
        print(f"check: the quickstart did not learn (gain {last - first:+.3f} < {MIN_GAIN})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
