"""``MegatronTrainBackend``: the :class:`~rlzoo.protocols.TrainBackend` on megatron-core.

Written against megatron-core 0.16.1 (the last release for Python 3.11; 0.19.x needs 3.12 and keeps
the same calls). **Not yet run on a GPU.** What is tested on CPU: the HF ↔ megatron conversion
(:mod:`.convert`) and the vocab-parallel log-probs (:mod:`.vocab_parallel`) this module is built
on. The ``megatron`` parameterisation of the train contract suite runs it when megatron-core and a
CUDA GPU are present.

SPMD: every rank of the world (``tp × pp × dp``) runs the same calls with the same full
mini-batch; each data-parallel rank takes its contiguous slice (the objective normalises by the
mini-batch's global counts, so gradients are summed: ``calculate_per_token_loss=True`` turns off
megatron's division by micro-batch count and DP size, and ``finalize_model_grads`` is called
without a token count). Micro-batches go through ``get_forward_backward_func()`` (1F1B when PP > 1).
Log-probs are computed on the last PP stage from vocab-sharded logits
(:func:`.vocab_parallel.vocab_parallel_log_probs` with TP-group all-reduces), then all-gathered
over DP and broadcast over PP, so every rank returns the whole batch's ``[B, T]``.

Attention: an explicit boolean mask ``[b, 1, S, S]`` (causal + key padding, True = masked) is
passed; megatron's local ``DotProductAttention`` applies it. Left padding shifts absolute
positions, which rotary embeddings do not see (scores depend on position differences; padded keys
are masked). With ``layer_spec='te'`` Transformer Engine's causal kernel may ignore the padding
mask: use packed sequences (TODO: THD ``packed_seq_params``, as verl does) or the local spec.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.backends.megatron import MegatronParams
from rlzoo.backends.megatron.convert import (
    ModelDims,
    gpt_model_kwargs,
    hf_to_mcore,
    mcore_to_hf,
    merge_tp,
    padded_vocab_size,
    shard_tp,
    split_pp,
    stage_layers,
    transformer_config_kwargs,
)
from rlzoo.backends.megatron.vocab_parallel import tp_reductions, vocab_parallel_log_probs
from rlzoo.backends.native import checkpoint as ckpt
from rlzoo.backends.native import common
from rlzoo.batch import Batch
from rlzoo.protocols import Objective, TrainSpec

__all__ = ["MegatronTrainBackend", "attention_mask"]

logger = logging.getLogger(__name__)
CHECKPOINT_FORMAT = "rlzoo-megatron-train/1"


def attention_mask(attn: Tensor) -> Tensor:
    """``[b, 1, S, S]`` bool, True where attention is NOT allowed (megatron's convention).

    Query ``i`` may see key ``j`` iff ``j <= i`` and key ``j`` is a real token.
    """
    S = attn.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=attn.device).tril()  # [S, S]
    allowed = causal[None] & attn.bool()[:, None, :]  # [b, S, S]
    return ~allowed[:, None]  # [b, 1, S, S]


#: what the backends of this process set up themselves (and so tear down when the last one shuts
#: down): the process group, megatron's model-parallel state, and how many backends use them
_OWNED: dict[str, Any] = {"group": False, "model_parallel": False, "users": 0}


def _init_distributed(device: str) -> None:
    """A process group of the device's kind: NCCL on ``cuda`` (one GPU per rank), gloo on ``cpu``.

    Joins ``torchrun``'s world (``RANK`` / ``WORLD_SIZE`` set) or starts a one-process group.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            # the launcher's world (torchrun): it outlives any backend; never torn down here (a
            # second init over the launcher's store after a teardown would wait forever)
            dist.init_process_group(backend, init_method="env://")
        else:
            _OWNED["group"] = True
            from rlzoo.distributed.weight_sync import free_port

            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
            )
    if device == "cuda":
        torch.cuda.set_device(
            int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(1, torch.cuda.device_count())))
        )


def _seed(seed: int, device: str) -> None:
    """Megatron's RNG tracker. On CPU there is no CUDA generator to fork: the no-op tracker is used
    (its ``fork()`` is a null context), which is exact here because every dropout is 0 and the
    weights are loaded from the checkpoint, never initialised at random."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    if device == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    else:
        from megatron.core.tensor_parallel.random import initialize_rng_tracker

        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def _require_psutil() -> None:
    """megatron-core's checkpoint writer imports psutil in a worker; without it a save hangs."""
    try:
        import psutil  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "the 'megatron' train backend needs psutil (megatron-core's dist_checkpointing writer hangs "
            "without it): pip install 'rlzoo[megatron]' or pip install psutil"
        ) from e


def _init_torch_adam_state(optimizer: Any, step: int | None = None) -> None:
    """Give a fresh torch ``Adam`` / ``AdamW`` inside a megatron optimizer its (zero) state; with
    ``step``, set every param's Adam step count to it.

    megatron-core's distributed optimizer, without Apex / Transformer Engine, reads every param's
    ``step`` when it builds the sharded state dict to load into (``DistributedOptimizer.state_dict``),
    and a fresh optimizer has none: this fills in what the load then overwrites. Its
    ``dp_reshardable`` load restores the moments but leaves torch's per-param ``step`` at that
    placeholder, so after a load the step is set from the checkpoint: the number of optimizer
    steps taken (the policy version; a skipped step does not step Adam either).
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                state = inner.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)  # torch keeps it on the CPU
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if step is not None:
                    state["step"] = torch.tensor(
                        float(step), dtype=torch.float32, device=state["step"].device
                    )


def _load_hf_state_dict(path: str) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path!r}")
    out: dict[str, Tensor] = {}
    for f in files:
        out.update(load_file(str(f), device="cpu"))
    # Qwen2.5-VL checkpoints (transformers >= 4.52): the text decoder lives under model.language_model.
    return {
        k.replace("model.language_model.", "model."): v
        for k, v in out.items()
        if not k.startswith("model.visual.")
    }


class _ValueHead(nn.Module):
    """Replaces ``output_layer`` for the critic: hidden ``[s, b, H]`` → values ``[s, b, 1]`` (fp32)."""

    def __init__(self, hidden: int, sequence_parallel: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, 1, dtype=torch.float32)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.sequence_parallel = sequence_parallel

    def forward(
        self, hidden: Tensor, weight: Tensor | None = None, runtime_gather_output: Any = None
    ) -> tuple[Tensor, None]:
        if self.sequence_parallel:
            from megatron.core import tensor_parallel

            hidden = tensor_parallel.gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=False
            )
        return self.linear(hidden.float()), None


def _on_device(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a method in the backend's device context (:func:`.cpu.cpu_device` for ``device: cpu``)."""

    @functools.wraps(fn)
    def wrapper(self: MegatronTrainBackend, *args: Any, **kwargs: Any) -> Any:
        with self._device_context():
            return fn(self, *args, **kwargs)

    return wrapper


class MegatronTrainBackend:
    """Actor (+ frozen reference, + critic) on megatron-core. See the module docstring."""

    def __init__(self, params: MegatronParams, spec: TrainSpec) -> None:
        self.params, self.spec = params, spec
        with self._device_context():
            self._setup(params, spec)

    def _device_context(self) -> contextlib.AbstractContextManager[None]:
        if self.params.device == "cpu":
            from rlzoo.backends.megatron.cpu import cpu_device

            return cpu_device()
        return contextlib.nullcontext()

    def _setup(self, params: MegatronParams, spec: TrainSpec) -> None:
        try:
            import megatron.core  # noqa: F401
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "the 'megatron' train backend needs megatron-core: pip install 'rlzoo[megatron]'"
            ) from e
        if params.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                "the 'megatron' train backend with device 'cuda' needs a CUDA GPU (device: cpu runs it on "
                "a gloo group on the CPU)"
            )
        if spec.micro_batch.max_tokens is not None:
            raise ValueError(
                "the 'megatron' train backend splits micro-batches by sample count "
                f"(trainer.micro_batch.size); trainer.micro_batch.max_tokens={spec.micro_batch.max_tokens} "
                "is not supported: set it to null"
            )
        _require_psutil()
        from megatron.core import parallel_state as mpu
        from transformers import AutoConfig

        self.temperature = params.temperature if params.temperature is not None else spec.temperature
        self.version = 0
        self.critic_steps = 0
        self.warmup_steps = common.warmup_steps(spec)
        _init_distributed(params.device)
        tp, pp = params.tensor_model_parallel_size, params.pipeline_model_parallel_size
        if not mpu.model_parallel_is_initialized():
            mpu.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
            _OWNED["model_parallel"] = True
        _OWNED["users"] += 1
        self._uses_owned_state = True
        _seed(spec.seed, params.device)
        self.mpu = mpu
        self.tp_rank, self.tp = mpu.get_tensor_model_parallel_rank(), tp
        self.pp_rank, self.pp = mpu.get_pipeline_model_parallel_rank(), pp
        self.dp_rank, self.dp = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
        self.dtype = torch.bfloat16 if params.dtype == "bfloat16" else torch.float32
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if params.device == "cuda"
            else torch.device("cpu")
        )

        hf_cfg = AutoConfig.from_pretrained(spec.model_path, trust_remote_code=spec.trust_remote_code)
        self.dims = ModelDims.from_hf(hf_cfg)
        self.vocab_padded = padded_vocab_size(self.dims.vocab_size, tp, params.make_vocab_size_divisible_by)
        self.config = self._transformer_config()
        full = hf_to_mcore(
            _load_hf_state_dict(spec.model_path),
            self.dims,
            layer_spec=params.layer_spec,
            vocab_padded=self.vocab_padded,
        )
        self._init_state = self._my_shard(full)
        del full

        self.actor = self._build(self._init_state)
        self.actor_ddp, self.optimizer = self._wrap(
            self.actor, spec.optim.lr, spec.optim.weight_decay, spec.optim.grad_clip
        )
        self.ref: nn.Module | None = None
        if spec.need_reference:
            self.ref = self._build(self._init_state).eval().requires_grad_(False)
            if params.ref_offload:
                self.ref.to("cpu")
        self.critic: nn.Module | None = None
        self.critic_ddp: Any = None
        self.critic_optimizer: Any = None
        if spec.need_critic:
            critic_state = self._init_state
            if spec.critic_model_path:
                critic_state = self._my_shard(
                    hf_to_mcore(
                        _load_hf_state_dict(spec.critic_model_path),
                        self.dims,
                        layer_spec=params.layer_spec,
                        vocab_padded=self.vocab_padded,
                    )
                )
            self.critic = self._build(critic_state, value_head=True)
            self.critic_ddp, self.critic_optimizer = self._wrap(
                self.critic, spec.optim.critic_lr, spec.optim.critic_weight_decay, spec.optim.critic_grad_clip
            )
        self.reduce_sum, self.reduce_max = tp_reductions(mpu.get_tensor_model_parallel_group())
        self._offloaded: dict[int, list[tuple[Any, Tensor, int]]] = {}
        if params.param_offload:
            self._offload(self.actor_ddp)
            if self.critic_ddp is not None:
                self._offload(self.critic_ddp)

    # -- building ---------------------------------------------------------------------------------
    def _transformer_config(self) -> Any:
        from megatron.core.transformer import TransformerConfig

        p = self.params
        extra: dict[str, Any] = {
            "tensor_model_parallel_size": p.tensor_model_parallel_size,
            "pipeline_model_parallel_size": p.pipeline_model_parallel_size,
            "sequence_parallel": p.sequence_parallel,
            "params_dtype": self.dtype,
            "pipeline_dtype": self.dtype,
            "bf16": self.dtype == torch.bfloat16,
            "calculate_per_token_loss": True,  # no division by micro-batches or DP size (see module doc)
            "perform_initialization": False,  # every weight is loaded from the HF checkpoint
            "use_cpu_initialization": self.device.type == "cpu",  # allocate on the CPU, not cuda
        }
        if p.recompute_activations:
            extra.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        return TransformerConfig(**transformer_config_kwargs(self.dims, **extra))

    def _layer_spec(self) -> Any:
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_local_spec,
            get_gpt_layer_with_transformer_engine_spec,
        )

        if self.params.layer_spec == "te":
            return get_gpt_layer_with_transformer_engine_spec()
        return get_gpt_layer_local_spec(normalization="RMSNorm")

    def _my_shard(self, full: Mapping[str, Tensor]) -> dict[str, Tensor]:
        stage = split_pp(full, self.dims.num_layers, self.pp)[self.pp_rank]
        return shard_tp(stage, self.tp)[self.tp_rank]

    def _build(self, state: Mapping[str, Tensor], *, value_head: bool = False) -> nn.Module:
        from megatron.core.models.gpt import GPTModel

        kw = gpt_model_kwargs(self.dims, self.tp, self.params.make_vocab_size_divisible_by)
        model = GPTModel(
            # a copy per model: _wrap sets this model's own no_sync / finalize hooks on its config
            config=copy.copy(self.config),
            transformer_layer_spec=self._layer_spec(),
            pre_process=self.mpu.is_pipeline_first_stage(),
            post_process=self.mpu.is_pipeline_last_stage(),
            **kw,
        )
        if value_head and self.mpu.is_pipeline_last_stage():
            model.output_layer = _ValueHead(self.dims.hidden_size, self.params.sequence_parallel)
            model.share_embeddings_and_output_weights = False
            state = {k: v for k, v in state.items() if not k.startswith("output_layer.")}
        model = model.to(device=self.device, dtype=self.dtype)
        if value_head and self.mpu.is_pipeline_last_stage():
            model.output_layer.float()
        missing, unexpected = model.load_state_dict(dict(state), strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state") and "output_layer.linear" not in k]
        if missing or unexpected:
            raise RuntimeError(f"megatron load: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model

    def _wrap(self, model: nn.Module, lr: float, weight_decay: float, grad_clip: float) -> tuple[Any, Any]:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        p, optim = self.params, self.spec.optim
        config: Any = model.config  # this model's own copy (see _build)
        ddp = DistributedDataParallel(
            config,
            DistributedDataParallelConfig(
                grad_reduce_in_fp32=True,
                overlap_grad_reduce=False,
                use_distributed_optimizer=p.use_distributed_optimizer,
            ),
            model,
        )
        opt_cfg = OptimizerConfig(
            optimizer="adam",
            lr=lr,
            min_lr=lr * optim.min_lr_ratio,
            weight_decay=weight_decay,
            adam_beta1=optim.betas[0],
            adam_beta2=optim.betas[1],
            adam_eps=optim.eps,
            clip_grad=grad_clip if grad_clip > 0 else 0.0,
            bf16=self.dtype == torch.bfloat16,
            params_dtype=self.dtype,
            use_distributed_optimizer=p.use_distributed_optimizer,
            optimizer_cpu_offload=p.optimizer_offload,
            optimizer_offload_fraction=1.0 if p.optimizer_offload else 0.0,
            overlap_cpu_optimizer_d2h_h2d=p.optimizer_offload,
            use_precision_aware_optimizer=p.optimizer_offload,
        )
        optimizer = get_megatron_optimizer(opt_cfg, [ddp])

        def finalize(models: Any, num_tokens: Any = None, *args: Any, **kw: Any) -> Any:
            return finalize_model_grads(models, None, *args, **kw)  # sum, never divide by tokens

        config.finalize_model_grads_func = finalize
        config.no_sync_func = ddp.no_sync
        return ddp, optimizer

    # -- offload (storage resize keeps the DDP buffer views valid, as verl does) -----------------
    def _offload(self, ddp: Any, grads: bool = True) -> None:
        """Copy the weights (and gradient buffers) to CPU and free their device storage.

        With the distributed optimizer DDP keeps all weights in one contiguous ``param_data``
        buffer per dtype; without it ``param_data`` is None and each parameter owns its storage,
        so the parameters are offloaded one by one.
        """
        cuda = self.device.type == "cuda"
        saved = []
        for buf in getattr(ddp, "buffers", []):
            parts = [buf.param_data] if buf.param_data is not None else [p.data for p in buf.params]
            if grads and self.params.grad_offload and buf.grad_data is not None:
                parts.append(buf.grad_data)
            for t in parts:
                if t.untyped_storage().size() > 0:
                    cpu = t.detach().to("cpu", copy=True)  # copy: on a CPU run .to() would alias
                    saved.append((t, cpu.pin_memory() if cuda else cpu, t.untyped_storage().size()))
                    t.untyped_storage().resize_(0)
        if cuda:
            torch.cuda.synchronize()
        self._offloaded[id(ddp)] = saved

    def _onload(self, ddp: Any) -> None:
        for t, cpu, size in self._offloaded.pop(id(ddp), []):
            t.untyped_storage().resize_(size)
            t.copy_(cpu, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # -- forward ----------------------------------------------------------------------------------
    def _dp_slice(self, batch: Batch) -> tuple[Batch, list[int]]:
        B = len(batch)
        bounds = [round(r * B / self.dp) for r in range(self.dp + 1)]
        return batch.select(slice(bounds[self.dp_rank], bounds[self.dp_rank + 1])), bounds

    def _run(
        self,
        module: Any,
        batch: Batch,
        *,
        mb_size: int,
        objective: Objective | None,
        with_entropy: bool,
        values: bool,
        forward_only: bool,
    ) -> tuple[list[Tensor], list[Tensor | None], dict[str, float]]:
        """Micro-batches of ``batch`` through ``module`` with megatron's schedule; returns, on the
        last PP stage, per micro-batch outputs (log-probs or values) and entropies."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        T = batch["responses"].shape[1]
        S = batch["input_ids"].shape[1]
        mbs = [mb.to(self.device) for mb in batch.split(mb_size)] if len(batch) else []
        outs: list[Tensor] = []
        ents: list[Tensor | None] = []
        losses: list[float] = []
        temperature = self.temperature
        vocab_start = self.tp_rank * (self.vocab_padded // self.tp)

        def step(data_iter: Iterator[Batch], model: Any) -> tuple[Tensor, Any]:
            mb = next(data_iter)
            ids, attn = mb["input_ids"], mb["attention_mask"]  # [b, S]
            pos = mb["position_ids"] if "position_ids" in mb else (attn.long().cumsum(-1) - 1).clamp(min=0)
            output = model(input_ids=ids, position_ids=pos, attention_mask=attention_mask(attn))

            def loss_func(out: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
                valid = mb["attention_mask"][:, -T:].bool()  # [b, T]
                ent = None
                if values:
                    res = out[:, S - T - 1 : S - 1, 0].float()  # [b, T]: position P-1+t
                else:
                    logits = out[:, S - T - 1 : S - 1]  # [b, T, V/tp]
                    res, ent = vocab_parallel_log_probs(
                        logits,
                        mb["responses"],
                        vocab_start,
                        reduce_sum=self.reduce_sum,
                        reduce_max=self.reduce_max,
                        temperature=temperature,
                        with_entropy=with_entropy,
                        vocab_size=self.dims.vocab_size,
                    )
                res = torch.where(valid, res, 0.0)  # [b, T]
                if ent is not None:
                    ent = torch.where(valid, ent, 0.0)
                outs.append(res.detach())
                ents.append(None if ent is None else ent.detach())
                if objective is None:
                    loss = res.sum() * 0.0
                else:
                    loss, _ = objective(mb, res, ent)
                    losses.append(float(loss.detach()))
                return loss, torch.ones((), dtype=torch.int, device=loss.device), {"loss": loss.detach()}

            return output, loss_func

        if mbs:
            get_forward_backward_func()(
                forward_step_func=step,
                data_iterator=iter(mbs),
                model=[module],
                num_microbatches=len(mbs),
                seq_length=S,
                micro_batch_size=mb_size,
                forward_only=forward_only,
            )
        return outs, ents, {"loss": sum(losses)}

    def _gather(self, local: list[Tensor], bounds: list[int], T: int) -> Tensor:
        """Per-micro-batch ``[b, T]`` of this DP rank (last PP stage) → ``[B, T]`` on every rank."""
        import torch.distributed as dist

        B = bounds[-1]
        mine = torch.cat(local) if local else torch.zeros(0, T, device=self.device)
        full = torch.zeros(B, T, device=self.device)
        if self.mpu.is_pipeline_last_stage():
            full[bounds[self.dp_rank] : bounds[self.dp_rank + 1]] = mine
        dist.all_reduce(full, group=self.mpu.get_data_parallel_group())  # disjoint rows: a sum gathers
        if self.pp > 1:
            dist.broadcast(
                full,
                src=self.mpu.get_pipeline_model_parallel_last_rank(),
                group=self.mpu.get_pipeline_model_parallel_group(),
            )
        return full

    @_on_device
    @torch.no_grad()
    def compute_log_probs(
        self, batch: Batch, *, model: str = "actor", with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        if model == "actor":
            module, ddp = self.actor_ddp, self.actor_ddp
        elif model == "ref":
            if self.ref is None:
                raise ValueError(
                    "compute_log_probs(model='ref'): no reference model (spec.need_reference=False)"
                )
            module, ddp = self.ref, None
        else:
            raise ValueError(f"compute_log_probs: model must be 'actor' or 'ref', got {model!r}")
        T = batch["responses"].shape[1]
        if ddp is not None and self.params.param_offload:
            self._onload(ddp)
        if model == "ref" and self.params.ref_offload:
            self.ref.to(self.device)  # type: ignore[union-attr]
        try:
            module.eval()
            local, bounds = self._dp_slice(batch)
            lps, ents, _ = self._run(
                module,
                local,
                mb_size=self.spec.micro_batch.log_prob_size,
                objective=None,
                with_entropy=with_entropy,
                values=False,
                forward_only=True,
            )
            out = self._gather(lps, bounds, T).to(batch["input_ids"].device)
            ent = None
            if with_entropy:
                ent = self._gather([e for e in ents if e is not None], bounds, T).to(
                    batch["input_ids"].device
                )
            return out, ent
        finally:
            if model == "ref" and self.params.ref_offload:
                self.ref.to("cpu")  # type: ignore[union-attr]
            if ddp is not None and self.params.param_offload:
                self._offload(ddp)

    @_on_device
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Tensor:
        if self.critic_ddp is None:
            raise ValueError("compute_values: no critic (spec.need_critic=False)")
        if self.params.param_offload:
            self._onload(self.critic_ddp)
        try:
            self.critic_ddp.eval()
            local, bounds = self._dp_slice(batch)
            vals, _, _ = self._run(
                self.critic_ddp,
                local,
                mb_size=self.spec.micro_batch.log_prob_size,
                objective=None,
                with_entropy=False,
                values=True,
                forward_only=True,
            )
            return self._gather(vals, bounds, batch["responses"].shape[1]).to(batch["input_ids"].device)
        finally:
            if self.params.param_offload:
                self._offload(self.critic_ddp)

    # -- updates ----------------------------------------------------------------------------------
    def lr_at(self, step: int, *, critic: bool = False) -> float:
        """The LR of optimizer step ``step`` (0-based) of the actor or the critic (``trainer.optim``)."""
        return common.scheduled_lr(self.spec, self.warmup_steps, step, critic=critic)

    def _grads_finite(self, ddp: Any) -> bool:
        """Whether every rank's gradients are finite (megatron keeps them in ``main_grad``)."""
        import torch.distributed as dist

        grads = []
        for p in ddp.parameters():
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is not None:
                grads.append(torch.isfinite(g).all())
        bad = (~torch.stack(grads).all()).float() if grads else torch.zeros((), device=self.device)
        bad = bad.reshape(1).to(self.device)
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return not bool(bad.item())

    def _update(
        self,
        ddp: Any,
        optimizer: Any,
        mini_batch: Batch,
        objective: Objective,
        *,
        values: bool,
        lr: float,
        prefix: str,
    ) -> dict[str, float]:
        if self.params.param_offload:
            self._onload(ddp)
        try:
            ddp.train()
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
            local, _ = self._dp_slice(mini_batch)
            needs_entropy = bool(getattr(objective, "needs_entropy", False)) and not values
            _, _, info = self._run(
                ddp,
                local,
                mb_size=self.spec.micro_batch.size,
                objective=objective,
                with_entropy=needs_entropy,
                values=values,
                forward_only=False,
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            if self._grads_finite(ddp):
                ok, grad_norm, _ = optimizer.step()
                grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
            else:  # without a loss scaler (fp32) megatron's step would apply the NaNs: skip it here
                ok, grad_norm = False, float("nan")
                ddp.zero_grad_buffer()
                optimizer.zero_grad()
            skipped = not ok or not math.isfinite(grad_norm)
            return {
                f"{prefix}/loss": info["loss"],
                f"{prefix}/grad_norm": grad_norm,
                f"{prefix}/lr": lr,
                f"{prefix}/skipped_steps": float(skipped),
            }
        finally:
            if self.params.param_offload:
                self._offload(ddp)

    @_on_device
    def update_policy(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        m = self._update(
            self.actor_ddp,
            self.optimizer,
            mini_batch,
            objective,
            values=False,
            lr=self.lr_at(self.version),
            prefix="actor",
        )
        if not m["actor/skipped_steps"]:
            self.version += 1
        return m

    @_on_device
    def update_critic(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        if self.critic_ddp is None:
            raise ValueError("update_critic: no critic (spec.need_critic=False)")
        m = self._update(
            self.critic_ddp,
            self.critic_optimizer,
            mini_batch,
            objective,
            values=True,
            lr=self.lr_at(self.critic_steps, critic=True),
            prefix="critic",
        )
        if not m["critic/skipped_steps"]:
            self.critic_steps += 1
        return m

    # -- weights ----------------------------------------------------------------------------------
    def _stage_full(self, module: nn.Module) -> dict[str, Tensor]:
        """This PP stage's tensors, TP shards gathered (on every TP rank)."""
        import torch.distributed as dist

        group = self.mpu.get_tensor_model_parallel_group()
        local = {k: v for k, v in module.state_dict().items() if not k.endswith("_extra_state")}
        shards: list[dict[str, Tensor]] = [{} for _ in range(self.tp)]
        for name, t in local.items():
            parts = [torch.empty_like(t) for _ in range(self.tp)]
            dist.all_gather(parts, t.contiguous(), group=group)
            for r in range(self.tp):
                shards[r][name] = parts[r]
        return merge_tp(shards)

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        yield from self._export_hf().items()

    @_on_device
    def _export_hf(self) -> dict[str, Tensor]:
        """Full HF-named tensors of the actor (vocab unpadded), on every rank. Collective (SPMD).

        Gathers TP shards per stage and broadcasts each PP stage's tensors to every stage, then
        converts with :func:`.convert.mcore_to_hf`. Memory: one full copy of the model on the GPU
        of every rank while it is iterated (TODO: stream layer by layer for very large models).
        """
        import torch.distributed as dist

        if self.params.param_offload:
            self._onload(self.actor_ddp)
        try:
            mine = self._stage_full(self.actor)
            spans = stage_layers(self.dims.num_layers, self.pp)
            full: dict[str, Tensor] = {}
            for s in range(self.pp):
                names = [sorted(mine)] if s == self.pp_rank else [None]
                if self.pp > 1:
                    src = dist.get_global_rank(self.mpu.get_pipeline_model_parallel_group(), s)
                    dist.broadcast_object_list(
                        names, src=src, group=self.mpu.get_pipeline_model_parallel_group()
                    )
                for name in names[0] or []:
                    t = mine[name] if s == self.pp_rank else None
                    if self.pp > 1:
                        meta = [(tuple(t.shape), t.dtype) if t is not None else None]
                        dist.broadcast_object_list(
                            meta, src=src, group=self.mpu.get_pipeline_model_parallel_group()
                        )
                        if t is None:
                            t = torch.empty(meta[0][0], dtype=meta[0][1], device=self.device)
                        dist.broadcast(t, src=src, group=self.mpu.get_pipeline_model_parallel_group())
                    if name.startswith("decoder.layers."):
                        rest = name[len("decoder.layers.") :]
                        local_idx, tail = rest.split(".", 1)
                        name = f"decoder.layers.{int(local_idx) + spans[s].start}.{tail}"
                    full[name] = t  # type: ignore[assignment]
            hf = mcore_to_hf(full, self.dims, layer_spec=self.params.layer_spec)
            return {name: t.detach() for name, t in hf.items()}
        finally:
            if self.params.param_offload:
                self._offload(self.actor_ddp)

    def export_hf(self, path: str | Path) -> None:
        """Write the actor as a standard HF folder (``save_pretrained``: safetensors + config.json +
        the base model's tokenizer) to ``path``. Collective: every rank calls it, rank 0 writes.

        The tensors are :meth:`_export_hf`'s (TP / PP gathered, vocabulary padding dropped). Rank 0
        builds the base model's HF class from its config on the meta device and loads them with
        strict name and shape checks; tied embeddings are tied again, so ``lm_head.weight`` is
        written exactly when the base config unties it. A vision-language base keeps its vision
        tower from the base checkpoint (this backend trains the text decoder only). A failure on
        rank 0 is raised on every rank.
        """
        import torch.distributed as dist

        state = self._export_hf()
        error: list[str | None] = [None]
        if dist.get_rank() == 0:
            try:
                with ckpt.atomic_dir(Path(path), {"format": "hf"}) as tmp:
                    self._hf_model(state).save_pretrained(str(tmp))
                    common.save_tokenizer(None, self.spec, tmp)
            except Exception as e:
                error[0] = f"{type(e).__name__}: {e}"
                raise
            finally:
                del state
                dist.broadcast_object_list(error, src=0)  # the other ranks wait here, and learn the outcome
        else:
            del state
            dist.broadcast_object_list(error, src=0)
            if error[0] is not None:
                raise RuntimeError(f"export_hf failed on rank 0: {error[0]}")

    def _hf_model(self, state: Mapping[str, Tensor]) -> nn.Module:
        """The base model's HF class holding ``state`` (full HF-named tensors of the text decoder)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        from rlzoo.models.processor import has_vision_config

        trust = self.spec.trust_remote_code
        cfg = AutoConfig.from_pretrained(self.spec.model_path, trust_remote_code=trust)
        auto: Any = AutoModelForCausalLM
        vision = has_vision_config(self.spec.model_path, trust)
        if vision:
            from transformers import AutoModelForImageTextToText

            auto = AutoModelForImageTextToText
        with torch.device("meta"):
            model = auto.from_config(cfg, trust_remote_code=trust, dtype=self.dtype)
        expected = set(model.state_dict())
        copies: dict[int, Tensor] = {}  # on the CPU, owning their storage; a tied pair stays one tensor
        tensors: dict[str, Tensor] = {}
        for name, t in state.items():
            if name not in expected and name.startswith("model."):  # VL: the decoder is model.language_model
                name = "model.language_model." + name[len("model.") :]
            if id(t) not in copies:
                copies[id(t)] = t.detach().to("cpu", copy=True)
            tensors[name] = copies[id(t)]
        if vision:  # not trained here: the base checkpoint's vision tower
            rest = sorted(k for k in expected - set(tensors) if "visual." in k)
            if rest:
                base = auto.from_pretrained(self.spec.model_path, trust_remote_code=trust, dtype=self.dtype)
                base_sd = base.state_dict()
                tensors.update({k: base_sd[k].detach().clone() for k in rest})
                del base, base_sd
        missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        if missing or unexpected:
            raise RuntimeError(
                f"export_hf: the converted tensors do not match {type(model).__name__} of "
                f"{self.spec.model_path}: missing {missing[:8]}, unexpected {unexpected[:8]}"
            )
        model.load_state_dict(tensors, strict=True, assign=True)  # raises on a shape mismatch
        if self.dims.tie_word_embeddings:
            model.tie_weights()
        meta = [n for n, p in model.named_parameters() if p.is_meta]
        if meta:
            raise RuntimeError(f"export_hf: parameters left without weights: {meta[:8]}")
        return model

    # -- checkpoints (megatron dist_checkpointing: every rank writes its shards) ------------------
    def _ckpt_metadata(self) -> dict[str, Any]:
        """How the distributed optimizer's state is laid out on disk. megatron-core 0.16's default
        ('fully_sharded_model_space', deprecated) is refused by its own ``dist_checkpointing.save``
        ("ShardedTensor.flattened_range is not supported"); 'dp_reshardable' saves each rank's
        buffers in parallel (resume with the same TP / PP, any DP)."""
        return (
            {"distrib_optim_sharding_type": "dp_reshardable"} if self.params.use_distributed_optimizer else {}
        )

    @_on_device
    def save_checkpoint(self, path: Path, extra_state: Mapping[str, Any]) -> None:
        import torch.distributed as dist
        from megatron.core import dist_checkpointing

        path = Path(path)
        extra = json.loads(json.dumps(dict(extra_state)))
        parts = [("actor", self.actor_ddp, self.optimizer)]
        if self.critic_ddp is not None:
            parts.append(("critic", self.critic_ddp, self.critic_optimizer))
        tmp = path.with_name(path.name + ".tmp")
        for name, ddp, opt in parts:
            if self.params.param_offload:
                self._onload(ddp)
            sd = ddp.module.sharded_state_dict(prefix="")
            (tmp / name).mkdir(parents=True, exist_ok=True)
            dist.barrier()
            osd = opt.sharded_state_dict(sd, metadata=self._ckpt_metadata())
            dist_checkpointing.save({"model": sd, "optimizer": osd}, str(tmp / name))
            if self.params.param_offload:
                self._offload(ddp)
        if dist.get_rank() == 0:
            meta = {
                "format": CHECKPOINT_FORMAT,
                "version": self.version,
                "critic_steps": self.critic_steps,
                "has_critic": self.critic_ddp is not None,
                "extra_state": extra,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            ckpt.save_tree(ckpt.rng_state(), tmp, "rng")
            (tmp / "COMPLETE").write_text(json.dumps({"format": CHECKPOINT_FORMAT}))
            if path.exists():
                import shutil

                shutil.rmtree(path)
            tmp.rename(path)
        dist.barrier()

    @_on_device
    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        from megatron.core import dist_checkpointing

        path = Path(path)
        ckpt.require_complete(path)
        meta = json.loads((path / "meta.json").read_text())
        parts = [("actor", self.actor_ddp, self.optimizer)]
        if self.critic_ddp is not None:
            parts.append(("critic", self.critic_ddp, self.critic_optimizer))
        steps = {"actor": int(meta["version"]), "critic": int(meta["critic_steps"])}
        for name, ddp, opt in parts:
            if self.params.param_offload:
                self._onload(ddp)
            sd = ddp.module.sharded_state_dict(prefix="")
            _init_torch_adam_state(opt)
            # is_loading=True: the optimizer's sharded state dict must be built for loading (it
            # allocates the state to load into); without it Adam's moments are silently not restored.
            osd = opt.sharded_state_dict(sd, is_loading=True, metadata=self._ckpt_metadata())
            loaded = dist_checkpointing.load({"model": sd, "optimizer": osd}, str(path / name))
            with torch.no_grad():  # fp32 + distributed optimizer: its main params are views of the weights
                ddp.module.load_state_dict(loaded["model"], strict=False)
                opt.load_state_dict(loaded["optimizer"])
            _init_torch_adam_state(opt, step=steps[name])
            if self.params.param_offload:
                self._offload(ddp)
        self.version = int(meta["version"])
        self.critic_steps = int(meta["critic_steps"])
        ckpt.set_rng_state(ckpt.load_tree(path, "rng"))
        return dict(meta["extra_state"])

    @_on_device
    def shutdown(self) -> None:
        for attr in ("actor", "actor_ddp", "ref", "critic", "critic_ddp", "optimizer", "critic_optimizer"):
            setattr(self, attr, None)
        if getattr(self, "_uses_owned_state", False):  # set once construction reached the group
            self._uses_owned_state = False
            _OWNED["users"] -= 1
            # the last backend out tears down what the backends set up, when that was a one-process
            # group of their own (in a launcher's world the state stays for the next backend)
            if _OWNED["users"] == 0 and _OWNED["group"]:
                import torch.distributed as dist

                if _OWNED["model_parallel"]:
                    self.mpu.destroy_model_parallel()
                    _OWNED["model_parallel"] = False
                if _OWNED["group"] and dist.is_initialized():
                    dist.destroy_process_group()
                    _OWNED["group"] = False
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
