"""Compose the quickstart recipe with a policy loss passed as an object (no registration).

python docs/examples/compose_run.py            # validate: resolve every part, load nothing
python docs/examples/compose_run.py --train    # and run one training step
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import rlzoo


@dataclass(frozen=True)
class MyClipParams:
    """Params of my_clip_loss."""

    clip: float = rlzoo.param(0.2, help="clip range of the ratio")


def my_clip_loss(inputs, params):  # type: ignore[no-untyped-def]
    """PPO-clip, written by hand: -min(r * A, clip(r, 1 - e, 1 + e) * A), aggregated with inputs.agg."""
    import torch

    from rlzoo.kernel.protocols import PolicyLossOutput

    ratio = torch.exp(inputs.log_probs - inputs.old_log_probs)  # [B, T]
    clipped = ratio.clamp(1 - params.clip, 1 + params.clip)  # [B, T]
    per_token = -torch.minimum(ratio * inputs.advantages, clipped * inputs.advantages)  # [B, T]
    return PolicyLossOutput(loss=inputs.agg(per_token, inputs.response_mask), metrics={})


def main(argv: list[str]) -> int:
    run = rlzoo.build_run(
        "quickstart",
        ["trainer.total_steps=1", "trainer.val_before_train=false"],
        policy_loss=rlzoo.part(my_clip_loss, params=MyClipParams()),
    )
    for sel in run.config.selections():
        print(f"{sel.key:24} {sel.kind:16} {sel.name:14} {sel.component.plugin}")
    if "--train" in argv:
        print(run.train())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
