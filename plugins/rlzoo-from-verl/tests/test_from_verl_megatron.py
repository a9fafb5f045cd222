"""verl's megatron context / expert parallelism sizes in ``rlzoo from-verl`` (issue 37): context
parallelism 1 is accepted (nothing to map), larger refused with the reason docs/backends/megatron.md
gives (what megatron-core itself refuses, tests/backends/test_megatron_parallel.py); expert
parallelism maps to the megatron backend's own sizes, which its params validate."""

from __future__ import annotations

import pytest
from rlzoo_from_verl import convert, parse_overrides

from rlzoo.kernel.errors import RlzooError

ACT = "actor_rollout_ref.actor.megatron."


def _convert(text: str):
    return convert(parse_overrides(text.split()))


def test_megatron_cp_size_refused_with_the_reason() -> None:
    key, reason = "context_parallel_size", "'Context parallelism is only supported by TEDotProductAttention!'"
    conv = _convert(f"actor_rollout_ref.actor.strategy=megatron {ACT}{key}=1")
    assert any(k == ACT + key for k, _, _ in conv.skipped)
    with pytest.raises(RlzooError) as e:
        _convert(f"actor_rollout_ref.actor.strategy=megatron {ACT}{key}=2")
    assert ACT + key in str(e.value) and reason in str(e.value)


def test_megatron_expert_parallel_sizes_map_to_the_backend() -> None:
    """Failed before (refused: 'converts dense Qwen2 checkpoints only'); the recipe's sizes are the
    backend's params (which refuse ETP ≠ TP by name: tests/backends/test_megatron_moe.py)."""
    from rlzoo.backends.megatron import MegatronParams

    conv = _convert(
        f"actor_rollout_ref.actor.strategy=megatron {ACT}expert_model_parallel_size=8 "
        f"{ACT}expert_tensor_parallel_size=1"
    )
    backend = conv.recipe["trainer"]["backend"]
    assert backend["expert_parallel_size"] == 8 and backend["expert_tensor_parallel_size"] == 1
    MegatronParams(**{k: v for k, v in backend.items() if k != "name"})  # TP 1: valid
