"""verl's megatron context / expert parallelism sizes in ``rlzoo from-verl`` (issue 37): 1 is
accepted (nothing to map), anything larger refused with the reason docs/backends/megatron.md gives
(what megatron-core itself refuses, tests/backends/test_megatron_parallel.py)."""

from __future__ import annotations

import pytest
from rlzoo_from_verl import convert, parse_overrides

from rlzoo.kernel.errors import RlzooError

ACT = "actor_rollout_ref.actor.megatron."


def _convert(text: str):
    return convert(parse_overrides(text.split()))


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("context_parallel_size", "'Context parallelism is only supported by TEDotProductAttention!'"),
        ("expert_model_parallel_size", "converts dense Qwen2 checkpoints only"),
        ("expert_tensor_parallel_size", "converts dense Qwen2 checkpoints only"),
    ],
)
def test_megatron_cp_and_ep_sizes_refused_with_the_reason(key: str, reason: str) -> None:
    conv = _convert(f"actor_rollout_ref.actor.strategy=megatron {ACT}{key}=1")
    assert any(k == ACT + key for k, _, _ in conv.skipped)
    with pytest.raises(RlzooError) as e:
        _convert(f"actor_rollout_ref.actor.strategy=megatron {ACT}{key}=2")
    assert ACT + key in str(e.value) and reason in str(e.value)
