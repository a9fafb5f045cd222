"""Clipped value loss for the critic (PPO with GAE). Not a registered kind: the critic update uses it.

verl: ``compute_value_loss`` in ``verl/trainer/ppo/core_algos.py`` (from TRL)::

    v_clip = clip(v, v_old - eps_v, v_old + eps_v)
    loss   = 0.5 * agg(max((v - R)^2, (v_clip - R)^2))
    vf_clipfrac = masked_mean((v_clip - R)^2 > (v - R)^2)

Aggregation goes through the same globally normalised ``BoundAgg`` as the policy loss, so the
critic loss is also invariant to the micro-batch split.
"""

from __future__ import annotations

# the core's ValueObjective uses it: the formula lives in rlzoo.formulas
from rlzoo.formulas import value_loss

__all__ = ["value_loss"]
