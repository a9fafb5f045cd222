"""Convert and validate every RL launch script of a verl checkout; print the outcome table.

    python plugins/rlzoo-from-verl/scripts/sweep.py /path/to/verl [--details]

Each ``.sh`` under ``examples/`` and ``verl/experimental/`` goes through ``from_verl`` and the recipe it
writes through ``load_config`` (what ``rlzoo from-verl SCRIPT --out r.yaml`` and ``rlzoo validate r.yaml``
do), in this process, from the checkout's root (where verl's scripts run), with the environment ``HOME``, ``PWD``, ``PATH`` and ``WANDB_MODE=offline`` (the scripts log to W&B). Where the reader asks for a
variable with ``--env NAME=VALUE``, the sweep gives it a placeholder (1 for a node / GPU count, else a path) and reads the script again (counted).
Scripts whose launch is verl's SFT trainer or its generation/eval entry points are not RL scripts: left out.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
from pathlib import Path

from rlzoo_from_verl.convert import from_verl

from rlzoo import RlzooError
from rlzoo.recipe.config import load_config

NOT_RL = re.compile(r"sft_trainer|main_generation|main_eval|fsdp_sft|sft\.|trainer\.sft|main_sft")
ASKS = re.compile(r"--env ([A-Za-z_][A-Za-z0-9_]*)=")


def placeholder(name: str) -> str:
    """A value of the kind the variable holds: a count for node / GPU counts, else a path."""
    if re.search(r"NODES|GPUS|NPROC|_NUM|NUM_|WORLD|SIZE", name):
        return "1"
    return f"/placeholder/{name.lower()}"


def one(path: Path, out: Path) -> tuple[str, str, int]:
    """(outcome, detail, variables given as placeholders)."""
    fixed: dict[str, str] = {}
    for _ in range(12):
        try:
            conv, _text = from_verl(str(path), out, fixed=fixed)
        except RlzooError as e:
            msg = str(e)
            new = [n for n in ASKS.findall(msg) if n not in fixed]
            if new:
                fixed.update({n: placeholder(n) for n in new})
                continue
            if "found no verl launch" in msg or "entry point" in msg:
                return "stopped", msg, len(fixed)
            if re.search(r"^(from-verl: )?line \d+|shell|ShellError", msg) and "rlzoo lacks" not in msg:
                return "shell", msg, len(fixed)
            return "refused", msg, len(fixed)
        except Exception as e:  # a crash: what the sweep exists to find
            return "CRASH", f"{type(e).__name__}: {e}", len(fixed)
        break
    else:
        return "stopped", "kept asking for variables", len(fixed)
    try:
        load_config(str(out), [])
    except RlzooError as e:
        return "validate refuses", str(e), len(fixed)
    except Exception as e:
        return "CRASH", f"validate: {type(e).__name__}: {e}", len(fixed)
    return ("converts, manual step" if conv.manual else "converts"), "", len(fixed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("verl")
    ap.add_argument("--details", action="store_true")
    ns = ap.parse_args()
    root = Path(ns.verl)
    scripts = sorted(p for d in ("examples", "verl/experimental") for p in (root / d).rglob("*.sh"))
    counts: collections.Counter[str] = collections.Counter()
    asked = 0
    rows = []
    env = {k: os.environ[k] for k in ("HOME", "PWD", "PATH") if k in os.environ}
    os.environ.clear()
    os.environ.update(env)
    os.environ["WANDB_MODE"] = "offline"  # the W&B check would ask for an API key this machine lacks
    os.chdir(root)  # verl's scripts run from the checkout's root: $(pwd) and relative paths mean it
    os.environ["PWD"] = str(root.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        for p in scripts:
            text = p.read_text(errors="replace")
            if NOT_RL.search(text) and "main_ppo" not in text:
                continue
            outcome, detail, n_fixed = one(p, Path(tmp) / "r.yaml")
            counts[outcome] += 1
            asked += n_fixed > 0
            rows.append((str(p.relative_to(root)), outcome, detail.splitlines()[0][:220] if detail else ""))
    if ns.details:
        for r in rows:
            print(" | ".join(r))
    print(f"\n{len(rows)} RL launch scripts ({asked} needed --env placeholders)\n")
    print("| outcome | scripts |\n|---|---|")
    for k, v in counts.most_common():
        print(f"| {k} | {v} |")
    return 1 if counts["CRASH"] else 0


if __name__ == "__main__":
    sys.exit(main())
