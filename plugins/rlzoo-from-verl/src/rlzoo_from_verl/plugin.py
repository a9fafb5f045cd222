"""The hook implementation of rlzoo-from-verl (named by the ``rlzoo`` entry point): ``rlzoo from-verl``.

Import-light: the converter is imported when the command runs.
"""

from __future__ import annotations

import argparse

from rlzoo import RlzooError, hookimpl
from rlzoo.kernel.commands import CliCommand

EXAMPLES = """\
  rlzoo from-verl run_qwen2-7b.sh --out recipes/grpo_qwen2.yaml     # a verl launch script
  rlzoo from-verl run_dapo.sh --env NNODES=2 --env CKPTS_DIR=/ckpt  # fix variables it reads / computes
  rlzoo from-verl algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=8 data.train_batch_size=64 \
      actor_rollout_ref.actor.ppo_mini_batch_size=16                  # or verl's overrides alone
  rlzoo validate recipes/grpo_qwen2.yaml                             # then check / train it"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", nargs="+", metavar="SCRIPT_OR_ARGS", help="a verl .sh script, or verl overrides"
    )
    parser.add_argument("--out", help="write the recipe here (default: print it)")
    parser.add_argument(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        help="fix a shell variable of the script (e.g. one it sets with $(...), which rlzoo never runs)",
    )


def run(ns: argparse.Namespace) -> int:
    from rlzoo_from_verl.convert import from_verl

    fixed: dict[str, str] = {}
    for item in ns.env or []:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise RlzooError(f"from-verl: --env {item!r}: expected NAME=VALUE")
        fixed[name] = value
    conv, text = from_verl(ns.source, ns.out, fixed=fixed)
    print(conv.report())
    if ns.out:
        print(f"wrote {ns.out}; check it with: rlzoo validate {ns.out}")
    else:
        print(text)
    return 0


@hookimpl
def rlzoo_cli_commands() -> list[CliCommand]:
    return [
        CliCommand(
            "from-verl",
            "turn a verl launch script (or its key=value overrides) into an rlzoo recipe",
            add_arguments,
            run,
            EXAMPLES,
        )
    ]
