"""``MegatronTrainBackend``: the :class:`~rlzoo.kernel.protocols.TrainBackend` on megatron-core.

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

Sibling modules, each given what it works on (none reads the backend): :mod:`.parallel` (process
group, seeding, the rank's :class:`~.parallel.Layout`, owned-state teardown), :mod:`.hf` (HF load /
export of the actor), :mod:`.offload` (the :class:`~.offload.Offloader` this backend owns),
:mod:`.checkpoint` (dist-checkpointing save / load of the trained models and their step counters).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.backends.megatron import MegatronParams, checkpoint, hf, parallel, replay
from rlzoo.backends.megatron.convert import (
    ModelDims,
    gpt_model_kwargs,
    hf_to_mcore,
    is_expert,
    padded_vocab_size,
    shard_ep,
    shard_tp,
    split_pp,
    transformer_config_kwargs,
)
from rlzoo.backends.megatron.hf import load_hf_state_dict
from rlzoo.backends.megatron.offload import Offloader
from rlzoo.backends.megatron.parallel import Layout, _init_distributed, _require_psutil, _seed
from rlzoo.backends.megatron.vocab_parallel import tp_reductions, vocab_parallel_log_probs
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.errors import import_optional
from rlzoo.kernel.protocols import Objective
from rlzoo.kernel.settings import TeacherModel, TrainSpec
from rlzoo.train_kit import update
from rlzoo.train_kit.logprobs import chunked_token_fn
from rlzoo.train_kit.models import resolve_temperature, select_model
from rlzoo.train_kit.update import LRSchedule

__all__ = ["MegatronTrainBackend", "attention_mask"]

logger = logging.getLogger(__name__)


def attention_mask(attn: Tensor) -> Tensor:
    """``[b, 1, S, S]`` bool, True where attention is NOT allowed (megatron's convention).

    Query ``i`` may see key ``j`` iff ``j <= i`` and key ``j`` is a real token.
    """
    S = attn.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=attn.device).tril()  # [S, S]
    allowed = causal[None] & attn.bool()[:, None, :]  # [b, S, S]
    return ~allowed[:, None]  # [b, 1, S, S]


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


@functools.cache
def _critic_model_class() -> Any:
    """``GPTModel`` for the critic, whose last PP stage has a :class:`_ValueHead` as ``output_layer``.

    Its sharded state dict (what megatron's ``dist_checkpointing`` saves and loads) describes that
    head: ``output_layer.linear.weight`` / ``.bias``, replicated over TP and DP like any plain module
    under a megatron module. ``GPTModel.sharded_state_dict`` and ``LanguageModule``'s under it only
    add the language-model output layer's handling (its vocab padding, its tie to the embeddings, its
    extra state, MTP's embedding copy), which looks up ``output_layer.weight`` (the KeyError a critic
    checkpoint failed with before) and none of which the value head has (``_build`` unties it); so
    on the last stage the sharded state dict is megatron's generic one, collected from the
    submodules. Other stages are the actor's. The actor keeps ``GPTModel`` (its checkpoint format
    is unchanged)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.module import MegatronModule

    class CriticGPTModel(GPTModel):  # type: ignore[misc]
        def sharded_state_dict(
            self,
            prefix: str = "",
            sharded_offsets: tuple[Any, ...] = (),
            metadata: dict[str, Any] | None = None,
        ) -> Any:
            if not isinstance(getattr(self, "output_layer", None), _ValueHead):
                return super().sharded_state_dict(prefix, sharded_offsets, metadata)
            if self.share_embeddings_and_output_weights or getattr(self, "mtp_process", False):
                raise RuntimeError("critic checkpoint: the value head must not be tied, nor MTP used")
            return MegatronModule.sharded_state_dict(self, prefix, sharded_offsets, metadata)

    return CriticGPTModel


def _on_device(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a method in the backend's device context (:func:`.cpu.cpu_device` for ``device: cpu``)."""

    @functools.wraps(fn)
    def wrapper(self: MegatronTrainBackend, *args: Any, **kwargs: Any) -> Any:
        with self._device_context():
            return fn(self, *args, **kwargs)

    return wrapper


class MegatronTrainBackend:
    """Actor (+ frozen reference, + forward-only teacher, + critic) on megatron-core. See the module
    docstring."""

    def __init__(self, params: MegatronParams, spec: TrainSpec) -> None:
        if (
            spec.lora is not None
        ):  # rlzoo validate refuses it (supports_lora false); never train all weights instead
            raise ValueError(
                "megatron train backend: trainer.lora (LoRA adapters) is not supported; use the native or "
                "fsdp2 train backend, or remove trainer.lora"
            )
        self.params, self.spec = params, spec
        with self._device_context():
            self._setup(params, spec)

    def _device_context(self) -> contextlib.AbstractContextManager[None]:
        if self.params.device == "cpu":
            from rlzoo.backends.megatron.cpu import cpu_device

            return cpu_device()
        return contextlib.nullcontext()

    def _setup(self, params: MegatronParams, spec: TrainSpec) -> None:
        import_optional(
            "megatron.core",
            "the 'megatron' train backend needs megatron-core: pip install 'rlzoo[megatron]'",
            ImportError,
        )
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

        self.temperature = resolve_temperature(params.temperature, spec)
        self.version = 0
        self.critic_steps = 0
        self.schedule = LRSchedule.from_spec(spec)
        hf_cfg = AutoConfig.from_pretrained(spec.model_path, trust_remote_code=spec.trust_remote_code)
        self.dims = ModelDims.from_hf(hf_cfg)
        tp, pp = params.tensor_model_parallel_size, params.pipeline_model_parallel_size
        ep = params.expert_parallel_size
        etp = tp if params.expert_tensor_parallel_size is None else params.expert_tensor_parallel_size
        parallel.check_expert_parallel(  # before a process group is started
            ep,
            etp,
            tp=tp,
            pp=pp,
            world=parallel.world_size(),
            num_experts=self.dims.num_experts,
            sequence_parallel=params.sequence_parallel,
        )
        if params.router_replay and not self.dims.num_experts:
            raise ValueError(
                f"trainer.backend.router_replay needs a MoE model; model.path {spec.model_path} is dense "
                f"(model_type {getattr(hf_cfg, 'model_type', '?')!r}, no experts): set router_replay false"
            )
        _init_distributed(params.device)
        if self.dims.num_experts:
            import megatron.core.transformer.moe.moe_utils as moe_utils
            import megatron.core.transformer.moe.token_dispatcher as token_dispatcher

            from rlzoo.backends.megatron.cpu import patch_moe

            patch_moe(moe_utils, token_dispatcher)  # no TE: the router's gemm; CPU: split sizes
        parallel.claim_owned(mpu, tp, pp, ep, etp)
        self._uses_owned_state = True
        _seed(spec.seed, params.device)
        self.mpu = mpu
        self.layout = Layout(
            tp=tp,
            tp_rank=mpu.get_tensor_model_parallel_rank(),
            pp=pp,
            pp_rank=mpu.get_pipeline_model_parallel_rank(),
            dp=mpu.get_data_parallel_world_size(),
            dp_rank=mpu.get_data_parallel_rank(),
            ep=ep,
            ep_rank=mpu.get_expert_model_parallel_rank(),
            etp=etp,
            etp_rank=mpu.get_expert_tensor_parallel_rank(),
        )
        self.dtype = torch.bfloat16 if params.dtype == "bfloat16" else torch.float32
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if params.device == "cuda"
            else torch.device("cpu")
        )

        self.vocab_padded = padded_vocab_size(self.dims.vocab_size, tp, params.make_vocab_size_divisible_by)
        self.config = self._transformer_config(self.dims)
        full = hf_to_mcore(
            load_hf_state_dict(spec.model_path),
            self.dims,
            layer_spec=params.layer_spec,
            vocab_padded=self.vocab_padded,
        )
        self._init_state = self._my_shard(full, self.dims)
        del full

        self.actor = self._build(self._init_state, router_replay=params.router_replay)
        self._replays = replay.routers_of(self.actor) if params.router_replay else []
        self.actor_ddp, self.optimizer = self._wrap(
            self.actor, spec.optim.lr, spec.optim.weight_decay, spec.optim.grad_clip
        )
        self.ref: nn.Module | None = None
        if spec.need_reference:
            self.ref = self._build(self._init_state).eval().requires_grad_(False)
            if params.ref_offload:
                self.ref.to("cpu")
        # a forward-only teacher (algorithm.teacher): its own dims, sharded and offloaded like the reference
        self.teacher: nn.Module | None = None
        self.teacher_dims: ModelDims | None = None
        self.teacher_vocab_padded = 0
        if spec.teacher is not None:
            self.teacher = self._load_teacher(spec.teacher)
            if params.ref_offload:
                self.teacher.to("cpu")
        self.critic: nn.Module | None = None
        self.critic_ddp: Any = None
        self.critic_optimizer: Any = None
        if spec.need_critic:
            critic_state = self._init_state
            if spec.critic_model_path:
                critic_state = self._my_shard(
                    hf_to_mcore(
                        load_hf_state_dict(spec.critic_model_path),
                        self.dims,
                        layer_spec=params.layer_spec,
                        vocab_padded=self.vocab_padded,
                    ),
                    self.dims,
                )
            self.critic = self._build(critic_state, value_head=True)
            self.critic_ddp, self.critic_optimizer = self._wrap(
                self.critic, spec.optim.critic_lr, spec.optim.critic_weight_decay, spec.optim.critic_grad_clip
            )
        self.reduce_sum, self.reduce_max = tp_reductions(mpu.get_tensor_model_parallel_group())
        self.offloader = Offloader(self.device, params=params.param_offload, grads=params.grad_offload)
        self.offloader.offload(self.actor_ddp)  # a no-op without param_offload
        if self.critic_ddp is not None:
            self.offloader.offload(self.critic_ddp)

    def _load_teacher(self, teacher: TeacherModel) -> nn.Module:
        """The teacher's GPTModel from its HF folder: converted and sharded over TP / PP (/ EP) as the
        actor is, with its own dims (another size of the same family, the student's tokenizer),
        frozen and in eval mode, in the backend's dtype."""
        from transformers import AutoConfig

        if teacher.dtype is not None and teacher.dtype != self.params.dtype:
            raise ValueError(
                f"megatron train backend: algorithm.teacher.dtype {teacher.dtype!r} differs from "
                f"trainer.backend.dtype {self.params.dtype!r}; megatron builds the teacher in the backend's "
                f"dtype: set algorithm.teacher.dtype to null or {self.params.dtype!r}"
            )
        if not Path(teacher.path).is_dir():
            raise ValueError(
                f"megatron train backend: algorithm.teacher.model {teacher.path!r} is not a folder; the "
                "megatron backend converts a local Hugging Face folder (*.safetensors): download it first"
            )
        try:
            dims = ModelDims.from_hf(
                AutoConfig.from_pretrained(teacher.path, trust_remote_code=teacher.trust_remote_code)
            )
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"megatron train backend: algorithm.teacher.model {teacher.path!r}: {exc}; the megatron "
                "backend loads Qwen2 / Qwen3 (-MoE) teachers (or use the native / fsdp2 train backend)"
            ) from exc
        if dims.num_experts:
            lay = self.layout
            parallel.check_expert_parallel(
                lay.ep,
                lay.etp,
                tp=lay.tp,
                pp=lay.pp,
                world=parallel.world_size(),
                num_experts=dims.num_experts,
                sequence_parallel=self.params.sequence_parallel,
            )
            import megatron.core.transformer.moe.moe_utils as moe_utils
            import megatron.core.transformer.moe.token_dispatcher as token_dispatcher

            from rlzoo.backends.megatron.cpu import patch_moe

            patch_moe(moe_utils, token_dispatcher)
        vocab_padded = padded_vocab_size(
            dims.vocab_size, self.layout.tp, self.params.make_vocab_size_divisible_by
        )
        full = hf_to_mcore(
            load_hf_state_dict(teacher.path),
            dims,
            layer_spec=self.params.layer_spec,
            vocab_padded=vocab_padded,
        )
        state = self._my_shard(full, dims)
        del full
        self.teacher_dims, self.teacher_vocab_padded = dims, vocab_padded
        model = self._build(state, dims=dims, config=self._transformer_config(dims))
        return model.eval().requires_grad_(False)

    # -- building ---------------------------------------------------------------------------------
    def _transformer_config(self, dims: ModelDims) -> Any:
        from megatron.core.transformer import TransformerConfig

        p = self.params
        extra: dict[str, Any] = {
            "tensor_model_parallel_size": p.tensor_model_parallel_size,
            "pipeline_model_parallel_size": p.pipeline_model_parallel_size,
            "expert_model_parallel_size": p.expert_parallel_size,
            "expert_tensor_parallel_size": self.layout.etp,
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
        return TransformerConfig(**transformer_config_kwargs(dims, **extra))

    def _layer_spec(self, dims: ModelDims) -> Any:
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_local_spec,
            get_gpt_layer_with_transformer_engine_spec,
        )

        moe = {"num_experts": dims.num_experts or None, "qk_layernorm": dims.qk_layernorm}
        if self.params.layer_spec == "te":
            return get_gpt_layer_with_transformer_engine_spec(**moe)
        return get_gpt_layer_local_spec(normalization="RMSNorm", **moe)

    def _my_shard(self, full: Mapping[str, Tensor], dims: ModelDims) -> dict[str, Tensor]:
        lay = self.layout
        stage = split_pp(full, dims.num_layers, lay.pp)[lay.pp_rank]
        if not dims.num_experts:
            return shard_tp(stage, lay.tp)[lay.tp_rank]
        stage = shard_ep(stage, dims.num_experts, lay.ep)[lay.ep_rank]
        experts = {k: v for k, v in stage.items() if is_expert(k)}  # split over ETP, the rest over TP
        rest = {k: v for k, v in stage.items() if not is_expert(k)}
        return shard_tp(rest, lay.tp)[lay.tp_rank] | shard_tp(experts, lay.etp)[lay.etp_rank]

    def _build(
        self,
        state: Mapping[str, Tensor],
        *,
        value_head: bool = False,
        router_replay: bool = False,
        dims: ModelDims | None = None,
        config: Any = None,
    ) -> nn.Module:
        """A GPTModel of ``dims`` / ``config`` (default: the actor's) with this rank's ``state``."""
        from megatron.core.models.gpt import GPTModel

        dims = self.dims if dims is None else dims
        kw = gpt_model_kwargs(dims, self.layout.tp, self.params.make_vocab_size_divisible_by)
        # a copy per model: _wrap sets this model's own no_sync / finalize hooks on its config; only
        # the actor's routers get a RouterReplay (:mod:`.replay`)
        config = copy.copy(self.config if config is None else config)
        config.moe_enable_routing_replay = router_replay
        model = (_critic_model_class() if value_head else GPTModel)(
            config=config,
            transformer_layer_spec=self._layer_spec(dims),
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

    # -- forward ----------------------------------------------------------------------------------
    def _dp_slice(self, batch: Batch) -> tuple[Batch, list[int]]:
        B, dp, dp_rank = len(batch), self.layout.dp, self.layout.dp_rank
        bounds = [round(r * B / dp) for r in range(dp + 1)]
        return batch.select(slice(bounds[dp_rank], bounds[dp_rank + 1])), bounds

    def _forward_only(
        self, module: Any, batch: Batch, *, values: bool, with_entropy: bool = False
    ) -> tuple[list[Tensor], list[Tensor | None], list[int]]:
        """This rank's share of ``batch`` through ``module`` without gradients: per micro-batch
        log-probs (or values), entropies, and the data-parallel slice bounds for :meth:`_gather`."""
        module.eval()
        outs, ents, _, bounds = self._run(module, batch, None, with_entropy=with_entropy, values=values)
        return outs, ents, bounds

    def _run(
        self, module: Any, batch: Batch, objective: Objective | None, *, with_entropy: bool, values: bool
    ) -> tuple[list[Tensor], list[Tensor | None], dict[str, float], list[int]]:
        """This rank's data-parallel share of ``batch`` through ``module`` with megatron's schedule:
        forward only in log-prob micro-batches without an ``objective``, else forward and backward of
        its loss in update micro-batches. Returns, on the last PP stage, per micro-batch outputs
        (log-probs or values) and entropies; the summed loss and the number of micro-batches; the
        slice bounds for :meth:`_gather`."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        forward_only = objective is None
        mb_size = self.spec.micro_batch.log_prob_rows if forward_only else self.spec.micro_batch.update_rows
        replays = self._replays if module is self.actor_ddp else []  # the actor replays the rollout's routes
        if replays:
            replay.check_routes(batch, num_layers=self.dims.num_layers, top_k=self.dims.moe_topk)
        batch, bounds = self._dp_slice(batch)
        T = batch["responses"].shape[1]
        S = batch["input_ids"].shape[1]
        mbs = [mb.to(self.device) for mb in batch.split(mb_size)] if len(batch) else []
        outs: list[Tensor] = []
        ents: list[Tensor | None] = []
        losses: list[float] = []
        temperature = self.temperature
        # the teacher has its own vocabulary size (the same tokenizer, maybe more padding rows)
        vocab_size, vocab_padded = self.dims.vocab_size, self.vocab_padded
        if self.teacher is not None and module is self.teacher:
            assert self.teacher_dims is not None
            vocab_size, vocab_padded = self.teacher_dims.vocab_size, self.teacher_vocab_padded
        vocab_start = self.layout.tp_rank * (vocab_padded // self.layout.tp)
        chunk = self.spec.micro_batch.log_prob_chunk

        def token_fn(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor | None]:
            return vocab_parallel_log_probs(
                logits,
                targets,
                vocab_start,
                reduce_sum=self.reduce_sum,
                reduce_max=self.reduce_max,
                temperature=temperature,
                with_entropy=with_entropy,
                vocab_size=vocab_size,
            )

        def step(data_iter: Iterator[Batch], model: Any) -> tuple[Tensor, Any]:
            mb = next(data_iter)
            ids, attn = mb["input_ids"], mb["attention_mask"]  # [b, S]
            pos = mb["position_ids"] if "position_ids" in mb else (attn.long().cumsum(-1) - 1).clamp(min=0)
            if replays:  # this micro-batch's experts on this stage's routers, for this forward
                per_layer = replay.replay_indices(
                    mb["routed_experts"],
                    first_layer=self.layout.pp_rank * (self.dims.num_layers // self.layout.pp),
                    num_layers=len(replays),
                    num_experts=self.dims.num_experts,
                    tp=self.layout.tp,
                    tp_rank=self.layout.tp_rank,
                    sequence_parallel=self.params.sequence_parallel,
                )
                for r, idx in zip(replays, per_layer):
                    r.set_target_indices(idx)
            output = model(input_ids=ids, position_ids=pos, attention_mask=attention_mask(attn))

            def loss_func(out: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
                valid = mb["attention_mask"][:, -T:].bool()  # [b, T]
                ent = None
                if values:
                    res = out[:, S - T - 1 : S - 1, 0].float()  # [b, T]: position P-1+t
                else:
                    logits = out[:, S - T - 1 : S - 1]  # [b, T, V/tp]
                    res, ent = chunked_token_fn(
                        token_fn, logits, mb["responses"], with_entropy=with_entropy, chunk_tokens=chunk
                    )  # the vocab-parallel math, chunks of positions (forward and backward)
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
            with replay.replaying(replays):
                get_forward_backward_func()(
                    forward_step_func=step,
                    data_iterator=iter(mbs),
                    model=[module],
                    num_microbatches=len(mbs),
                    seq_length=S,
                    micro_batch_size=mb_size,
                    forward_only=forward_only,
                )
        return outs, ents, {"loss": sum(losses), "num_micro_batches": float(len(mbs))}, bounds

    def _gather(self, local: list[Tensor], bounds: list[int], T: int) -> Tensor:
        """Per-micro-batch ``[b, T]`` of this DP rank (last PP stage) → ``[B, T]`` on every rank."""
        import torch.distributed as dist

        B = bounds[-1]
        mine = torch.cat(local) if local else torch.zeros(0, T, device=self.device)
        full = torch.zeros(B, T, device=self.device)
        if self.mpu.is_pipeline_last_stage():
            full[bounds[self.layout.dp_rank] : bounds[self.layout.dp_rank + 1]] = mine
        dist.all_reduce(full, group=self.mpu.get_data_parallel_group())  # disjoint rows: a sum gathers
        if self.layout.pp > 1:
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
        module: Any = select_model(model, self.actor_ddp, self.ref, self.teacher)
        ddp = self.actor_ddp if model == "actor" else None  # what param_offload moves; ref / teacher: none
        frozen = module if model in ("ref", "teacher") and self.params.ref_offload else None
        T = batch["responses"].shape[1]
        with self.offloader.resident(ddp):
            if frozen is not None:
                frozen.to(self.device)
            try:
                lps, ents, bounds = self._forward_only(module, batch, values=False, with_entropy=with_entropy)
                out = self._gather(lps, bounds, T).to(batch["input_ids"].device)
                ent = None
                if with_entropy:
                    ent = self._gather([e for e in ents if e is not None], bounds, T).to(
                        batch["input_ids"].device
                    )
                return out, ent
            finally:
                if frozen is not None:
                    frozen.to("cpu")

    @_on_device
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Tensor:
        if self.critic_ddp is None:
            raise ValueError("compute_values: no critic (spec.need_critic=False)")
        with self.offloader.resident(self.critic_ddp):
            vals, _, bounds = self._forward_only(self.critic_ddp, batch, values=True)
            return self._gather(vals, bounds, batch["responses"].shape[1]).to(batch["input_ids"].device)

    # -- updates ----------------------------------------------------------------------------------
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

    def _step(
        self,
        ddp: Any,
        optimizer: Any,
        mini_batch: Batch,
        objective: Objective,
        *,
        values: bool,
        with_entropy: bool,
        lr: float,
        prefix: str,
    ) -> dict[str, float]:
        """One optimizer step of ``ddp`` at ``lr`` (megatron's optimizer clips); skipped on every
        rank when any rank's gradients are not finite. Metrics: the train kit's ``step_metrics``."""
        import torch.distributed as dist

        with self.offloader.resident(ddp):
            ddp.train()
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
            _, _, info, _ = self._run(ddp, mini_batch, objective, with_entropy=with_entropy, values=values)
            update.set_lr(optimizer, lr)
            if self._grads_finite(ddp):
                ok, grad_norm, _ = optimizer.step()
                grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
            else:  # without a loss scaler (fp32) megatron's step would apply the NaNs: skip it here
                ok, grad_norm = False, float("nan")
                ddp.zero_grad_buffer()
                optimizer.zero_grad()
            skipped = not ok or not math.isfinite(grad_norm)
            if skipped and dist.get_rank() == 0:
                update.warn_skipped(
                    prefix, loss=info["loss"], grad_norm=grad_norm, world=dist.get_world_size()
                )
            return update.step_metrics(
                prefix,
                loss=info["loss"],
                grad_norm=grad_norm,
                lr=lr,
                skipped=skipped,
                num_micro_batches=int(info["num_micro_batches"]),
            )

    @_on_device
    def update_policy(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        """One actor optimizer step at ``schedule.lr(version)``; ``version`` counts the steps not
        skipped. Metrics: ``actor/loss`` (this rank's sum), ``actor/grad_norm``, ``actor/lr``,
        ``actor/skipped_steps``, ``actor/num_micro_batches`` (this rank's)."""
        metrics = self._step(
            self.actor_ddp,
            self.optimizer,
            mini_batch,
            objective,
            values=False,
            with_entropy=update.needs_entropy(objective),
            lr=self.schedule.lr(self.version),
            prefix="actor",
        )
        if not metrics["actor/skipped_steps"]:
            self.version += 1
        return metrics

    @_on_device
    def update_critic(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        """One critic optimizer step at ``schedule.lr(critic_steps, critic=True)``; ``critic_steps``
        counts the steps not skipped."""
        if self.critic_ddp is None:
            raise ValueError("update_critic: no critic (spec.need_critic=False)")
        metrics = self._step(
            self.critic_ddp,
            self.critic_optimizer,
            mini_batch,
            objective,
            values=True,
            with_entropy=False,
            lr=self.schedule.lr(self.critic_steps, critic=True),
            prefix="critic",
        )
        if not metrics["critic/skipped_steps"]:
            self.critic_steps += 1
        return metrics

    # -- weights (:mod:`.hf`) ------------------------------------------------------------------------
    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        yield from self._export_hf().items()

    @_on_device
    def _export_hf(self) -> dict[str, Tensor]:
        """The actor's full HF-named tensors on every rank (collective)."""
        with self.offloader.resident(self.actor_ddp):
            return hf.export_tensors(
                self.actor,
                dims=self.dims,
                layer_spec=self.params.layer_spec,
                layout=self.layout,
                device=self.device,
            )

    def export_hf(self, path: str | Path) -> None:
        hf.export_hf(path, self._export_hf, self.spec, dims=self.dims, dtype=self.dtype)

    # -- checkpoints (:mod:`.checkpoint`) ------------------------------------------------------------
    def _trained(self) -> list[checkpoint.Trained]:
        models = [checkpoint.Trained("actor", self.actor_ddp, self.optimizer)]
        if self.critic_ddp is not None:
            models.append(checkpoint.Trained("critic", self.critic_ddp, self.critic_optimizer))
        return models

    @_on_device
    def save_checkpoint(self, path: Path, extra_state: Mapping[str, Any]) -> None:
        checkpoint.save_checkpoint(
            path,
            extra_state,
            self._trained(),
            checkpoint.Steps(self.version, self.critic_steps),
            offloader=self.offloader,
            distributed_optimizer=self.params.use_distributed_optimizer,
        )

    @_on_device
    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        steps, extra_state = checkpoint.load_checkpoint(
            path,
            self._trained(),
            offloader=self.offloader,
            distributed_optimizer=self.params.use_distributed_optimizer,
        )
        self.version, self.critic_steps = steps
        return extra_state

    @_on_device
    def shutdown(self) -> None:
        if getattr(self, "_replays", None):
            replay.forget(self._replays)
            self._replays = []
        for attr in (
            "actor",
            "actor_ddp",
            "ref",
            "teacher",
            "critic",
            "critic_ddp",
            "optimizer",
            "critic_optimizer",
        ):
            setattr(self, attr, None)
        if getattr(self, "_uses_owned_state", False):  # set once construction reached the group
            self._uses_owned_state = False
            parallel.release_owned(self.mpu)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
