"""The megatron train backend plugin: params + registration. Import-light (no torch, no megatron).

The implementation lives in :mod:`rlzoo.backends.megatron.train` (megatron-core imported there,
on first use); the HF ↔ megatron conversion in :mod:`rlzoo.backends.megatron.convert` and the
vocab-parallel log-probs in :mod:`rlzoo.backends.megatron.vocab_parallel` are pure tensor code,
tested on CPU. See ``docs/backends/megatron.md``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlzoo import hookimpl
from rlzoo.kernel.errors import raise_problems
from rlzoo.kernel.params import check_ranges, param

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar

__all__ = ["MegatronParams"]

# what the hook at the end registers: the implementation (imported on first use), its capabilities
_TRAIN = "rlzoo.backends.megatron.train:MegatronTrainBackend"
_CAPABILITIES = {
    "distributed": True,
    "devices": ["cuda", "cpu"],  # cpu: device 'cpu', fp32 on a gloo group (tests, debugging)
    "supports_critic": True,
    "supports_teacher": True,  # not supplies_teacher_divergence: validate refuses gkd here by name
    "requires": "megatron-core",
    "extra": "megatron",
}


def _have_transformer_engine() -> bool:
    """Whether NVIDIA Transformer Engine is importable (without importing it)."""
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class MegatronParams:
    """megatron-core trainer: GPTModel from HF Qwen2 / Qwen3, dense or MoE, TP / PP / DP / EP, CPU offload.

    Needs the ``[megatron]`` extra and CUDA GPUs (NCCL); ``device: cpu`` runs it on a gloo group on
    the CPU (tests, debugging; see :mod:`rlzoo.backends.megatron.cpu`). Runs SPMD in every rank of a
    torch.distributed world of ``tp × pp × dp`` ranks (it starts a one-process group when none is
    initialised). The HF checkpoint is converted on load (fused QKV with GQA interleaving, gate/up
    fused into ``linear_fc1``, TP slices, padded vocab-parallel embeddings) and back on
    ``export_weights``, which yields full HF-named tensors for the rollout backend. Log-probs are
    computed from vocab-sharded logits without gathering them. Gradients are **summed** over
    micro-batches and data-parallel ranks (the objective divides by the mini-batch's global
    counts). Optional distributed optimizer (ZeRO-1), CPU offload of params / grads / optimizer
    between phases (the seed's geo3k run offloads all three), a critic (value head on the same
    decoder), a frozen, CPU-offloaded reference and a forward-only teacher (algorithm.teacher).

    The optimizer (Adam with decoupled weight decay), LR schedule and micro-batch sizes are the
    trainer's shared settings (``trainer.optim``, ``trainer.micro_batch``, in ``TrainSpec``);
    micro-batches are per data-parallel rank, by sample count (``micro_batch.max_tokens`` is not
    supported and refused).
    """

    device: str = param(
        "cuda",
        help="'cuda' (NCCL group, one GPU per rank) or 'cpu' (gloo group on the CPU: tests, debugging)",
    )
    tensor_model_parallel_size: int = param(1, help="TP: ranks each layer's matrices are split over")
    pipeline_model_parallel_size: int = param(1, help="PP: stages the layers are split over (equal split)")
    expert_parallel_size: int = param(
        1,
        ge=1,
        help="EP: ranks a MoE model's experts are split over (E/EP whole experts each; EP × ETP divides "
        "the ranks of a pipeline stage, EP the expert count)",
    )
    expert_tensor_parallel_size: int | None = param(
        None,
        ge=1,
        help="ETP: ranks each expert's matrices are split over (None: the TP size, megatron's default; "
        "another size is refused: measured wrong on CPU)",
    )
    sequence_parallel: bool = param(
        False, help="shard activations of norms / dropout over the TP ranks (TP > 1)"
    )
    layer_spec: str = param(
        "local", help="'local' (megatron-core modules, no extra dependency) or 'te' (Transformer Engine)"
    )
    dtype: str = param("bfloat16", help="'bfloat16' (fp32 master weights in the optimizer) or 'float32'")
    make_vocab_size_divisible_by: int = param(
        128, help="the embedding / output layer are padded to a multiple of this × TP (megatron's rule)"
    )
    recompute_activations: bool = param(
        False, help="full activation recomputation of every layer in backward"
    )
    router_replay: bool = param(
        False,
        help="MoE: the actor routes each token to the experts the rollout chose (batch routed_experts, "
        "recorded by a rollout backend with records_routes; verl's R3), routing weights from its own "
        "router logits; the reference and critic route themselves. docs/backends/megatron.md",
    )
    temperature: float | None = param(
        None,
        help="logits are divided by this before log-softmax (None: the rollout temperature, from the spec)",
    )
    # -- optimizer (megatron.core.optimizer.OptimizerConfig): lr, betas, weight decay, clipping and
    # the LR schedule are the trainer's shared settings (trainer.optim, in TrainSpec.optim) ---------
    use_distributed_optimizer: bool = param(
        True, help="shard optimizer state over data-parallel ranks (ZeRO-1)"
    )
    # -- offload (the seed's geo3k run sets all three) ------------------------------------------
    param_offload: bool = param(False, help="move the actor's / critic's weights to CPU between phases")
    grad_offload: bool = param(False, help="move the gradient buffers to CPU between updates")
    optimizer_offload: bool = param(
        False, help="run the optimizer step on CPU (megatron's optimizer_cpu_offload, fraction 1.0)"
    )
    ref_offload: bool = param(
        True,
        help="keep the frozen reference's (and the teacher's, algorithm.teacher) weights on the CPU between forwards",
    )

    def __post_init__(self) -> None:
        problems = check_ranges(self)
        if self.tensor_model_parallel_size < 1 or self.pipeline_model_parallel_size < 1:
            problems.append("tensor_model_parallel_size and pipeline_model_parallel_size must be >= 1")
        if self.layer_spec not in ("local", "te"):
            problems.append(f"layer_spec must be 'local' or 'te', got {self.layer_spec!r}")
        if self.dtype not in ("bfloat16", "float32"):
            problems.append(f"dtype must be 'bfloat16' or 'float32', got {self.dtype!r}")
        if self.device not in ("cuda", "cpu"):
            problems.append(f"device must be 'cuda' or 'cpu', got {self.device!r}")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            problems.append("sequence_parallel needs tensor_model_parallel_size > 1")
        if self.sequence_parallel and self.layer_spec != "te":
            problems.append(
                "sequence_parallel needs layer_spec 'te': megatron-core's local norms (layer_spec "
                "'local') do not support sequence parallelism"
            )
        etp = self.expert_tensor_parallel_size
        if etp is not None and etp != self.tensor_model_parallel_size:
            problems.append(
                f"expert_tensor_parallel_size {etp} differs from tensor_model_parallel_size "
                f"{self.tensor_model_parallel_size}: not supported (on a gloo group megatron-core 0.16's update "
                "of experts split 2-way with TP 1 differs from the unsplit model's, measured; not yet checked "
                "on GPUs); set it to null (the TP size)"
            )
        if self.optimizer_offload and not self.use_distributed_optimizer:
            problems.append(
                "optimizer_offload needs use_distributed_optimizer=True (megatron-core's CPU-offloaded "
                "optimizer is the precision-aware distributed optimizer)"
            )
        needs_te = [
            what
            for what, on in (
                ("layer_spec 'te'", self.layer_spec == "te"),
                ("optimizer_offload", self.optimizer_offload),
                ("sequence_parallel", self.sequence_parallel),
            )
            if on
        ]
        if needs_te and not _have_transformer_engine():
            problems.append(
                f"{' and '.join(needs_te)} need(s) NVIDIA Transformer Engine, which is not installed "
                "(pip install 'transformer-engine[pytorch]', built against your torch and CUDA; it is not "
                "in the [megatron] extra); without it use layer_spec 'local', optimizer_offload false, "
                "sequence_parallel false"
            )
        if self.router_replay and self.recompute_activations and self.pipeline_model_parallel_size > 1:
            problems.append(
                "router_replay with recompute_activations and pipeline_model_parallel_size > 1 is not "
                "supported (the recomputed forward of a micro-batch would replay another micro-batch's "
                "experts under the 1F1B schedule); set recompute_activations false or "
                "pipeline_model_parallel_size 1"
            )
        if self.temperature is not None and self.temperature <= 0:
            problems.append(f"temperature must be > 0, got {self.temperature}")
        if self.make_vocab_size_divisible_by < 1:
            problems.append("make_vocab_size_divisible_by must be >= 1")
        raise_problems("invalid megatron train params", problems)

    def check(self, cfg: Any) -> list[str]:
        """``router_replay`` needs a rollout backend that records the experts it routes to, set to."""
        if not self.router_replay:
            return []
        rb = cfg.rollout.backend
        if not hasattr(rb, "caps"):  # did not bind (reported already)
            return []
        if not rb.caps.records_routes:
            return [
                f"trainer.backend.router_replay: rollout backend {rb.name!r} does not record the experts a "
                "MoE model routes each token to (records_routes is false), which the megatron trainer would "
                "replay; use one that does (native, with record_routes: true) or set router_replay false"
            ]
        if not getattr(rb.params, "record_routes", False):
            return [
                f"trainer.backend.router_replay: set rollout.backend.record_routes: true (rollout backend "
                f"{rb.name!r} records the experts per token only when asked)"
            ]
        return []


@hookimpl
def rlzoo_register_train_backends(registry: Registrar[PartFactory]) -> None:
    registry.register("megatron", _TRAIN, params=MegatronParams, capabilities=_CAPABILITIES)
