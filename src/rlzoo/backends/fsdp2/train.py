"""The fsdp2 train backend: an SPMD worker that runs in every rank of a torch.distributed group.

Contract (see ``docs/backends/fsdp2.md``):

- **Inputs.** Every rank is called with the *same full* batch. Rank ``r`` works on
  ``plan.shards[r]`` (:func:`~rlzoo.backends.fsdp2.sharding.plan_shards`: samples balanced by real
  token count), cut into micro-batches; every rank runs the same number of passes (dummy ones,
  loss times zero, where its shard is short) because FSDP2's collectives must match.
- **Outputs.** ``compute_log_probs`` / ``compute_values`` all-gather the shards: every rank returns
  the full ``[B, T]`` result in the original order. ``update_*`` return the same metrics on every
  rank (losses summed over ranks; the objective's accumulated metrics merged across ranks).
- **Gradients** are summed over micro-batches and ranks, never averaged: the objective already
  divides by the whole mini-batch's counts, so FSDP2's reduce-scatter divide factor is set to 1.
- **export_weights** is collective: every rank must iterate it to the end; rank 0 receives
  ``(name, full tensor)`` one parameter at a time, the other ranks receive nothing.

Log-prob / value conventions, the LR schedule, the update loop and the checkpoint helpers are the
core train kit's (:mod:`rlzoo.train_kit`), as in the native backend: ``update_*`` run the step here,
handing this backend's forward, micro-batches and :class:`ProcessGroupRanks` to the kit's loop, and
count the steps taken.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from rlzoo.backends.fsdp2 import FSDP2Params, ulysses, ulysses_problems
from rlzoo.backends.fsdp2.collectives import ProcessGroupRanks, ensure_process_group
from rlzoo.backends.fsdp2.sharding import ShardPlan, plan_shards
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import Objective
from rlzoo.kernel.settings import TrainSpec
from rlzoo.train_kit import attention, lora, models, update
from rlzoo.train_kit import checkpoint as ckpt
from rlzoo.train_kit.logprobs import actor_log_probs, actor_log_probs_and_sum_pi_squared, critic_values
from rlzoo.train_kit.modes import eval_mode
from rlzoo.train_kit.update import Forward, LRSchedule, Target

__all__ = ["FSDP2TrainBackend"]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "rlzoo-fsdp2-train/1"


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: HF's ``_no_split_modules`` classes."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:  # fall back to the longest ModuleList
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
        layers = list(max(lists, key=len)) if lists else []  # type: ignore[arg-type]
    return layers


# ---------------------------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------------------------
class FSDP2TrainBackend:
    """Actor (+ frozen reference, + critic) sharded with FSDP2 over all ranks. See the module doc.

    ``version`` is the number of actor optimizer steps taken (skipped steps do not count).
    """

    def __init__(
        self,
        params: FSDP2Params,
        spec: TrainSpec,
        *,
        model: nn.Module | None = None,
        critic_backbone: nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        """Load the actor from ``spec.model_path`` (every rank), or shard ``model`` (same weights on
        every rank). ``critic_backbone`` / ``tokenizer`` as in the native backend."""
        self.params = params
        self.spec = spec
        self.temperature = models.resolve_temperature(
            params.temperature, spec
        )  # None: the rollout's, as native
        self.version = 0
        self.critic_steps = 0
        self._tokenizer = tokenizer
        want = ("cuda" if torch.cuda.is_available() else "cpu") if params.device == "auto" else params.device
        device_type = torch.device(want).type
        self._owns_group = ensure_process_group(device_type)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if device_type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", torch.device(want).index or 0))
            self.device = torch.device("cuda", local)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.dtype = models.DTYPES[params.dtype]
        self.mesh = self._make_mesh()
        self.sp = self._make_sp_group()  # None: ulysses_size 1
        self.offload = params.offload
        if self.offload and self.device.type == "cpu":
            logger.info("fsdp2: offload=True has no effect on CPU (params already live there); ignored")
            self.offload = False

        given_model = model is not None
        if model is None:
            model = models.load_causal_lm(spec.model_path, self._hf_kwargs(), vision=False)
        model = model.to(dtype=self.dtype)
        self._actor_cls: Any = type(model)
        self._actor_config = copy.deepcopy(model.config)
        self._keep_arg = models.takes_logits_to_keep(model)
        if params.use_remove_padding and not self._keep_arg:
            raise ValueError("fsdp2: use_remove_padding needs a model whose forward takes logits_to_keep")
        self._check_heads(model.config, "the actor")
        # with LoRA the reference is the actor with its adapters off (below), not a copy
        ref = (
            copy.deepcopy(model).eval().requires_grad_(False)
            if spec.need_reference and spec.lora is None
            else None
        )
        # a forward-only teacher (algorithm.teacher), sharded and offloaded like the reference
        teacher: Any = None
        self._teacher_keep_arg = False
        if spec.teacher is not None:
            teacher = models.load_teacher(spec.teacher, params, spec, self.dtype)
            self._teacher_keep_arg = models.takes_logits_to_keep(teacher)
            if params.use_remove_padding and not self._teacher_keep_arg:
                raise ValueError(
                    "fsdp2: use_remove_padding needs a teacher whose forward takes logits_to_keep"
                )
        critic: models.CriticModel | None = None
        if spec.need_critic:
            backbone: Any = models.critic_backbone(
                spec, critic_backbone, model, given_model=given_model, kwargs=self._hf_kwargs()
            )
            critic = models.CriticModel(backbone.to(self.dtype), int(backbone.config.hidden_size))
        if self.sp is not None:  # attention all-to-alls the SP group's pieces (after the deepcopies)
            sp_models: list[tuple[str, Any]] = [
                ("the actor", model),
                ("the reference", ref),
                ("the teacher", teacher),
            ]
            if critic is not None:
                sp_models.append(("the critic", critic.backbone))
            for what, sp_model in sp_models:
                if sp_model is not None:
                    self._check_heads(sp_model.config, what)
                    ulysses.install(sp_model, self.sp)
        elif params.use_remove_padding:  # packed rows attend per sequence
            for what, packed_model in (
                ("actor", model),
                ("reference", ref),
                ("teacher", teacher),
                ("critic", None if critic is None else critic.backbone),
            ):
                if packed_model is not None:
                    attention.install(packed_model, what=what)
        # LoRA: adapters injected in place before sharding (FSDP2 shards frozen and trainable alike)
        self._lora: Any = None
        if spec.lora is not None:  # peft makes the adapters fp32 under a bf16 base: one dtype for FSDP2
            self._lora = lora.apply_lora(model, spec.lora, seed=spec.seed)
            model = model.to(dtype=self.dtype)
        if params.gradient_checkpointing:
            m: Any
            for m in (model, critic.backbone if critic is not None else None):
                if m is not None:
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

        self.actor: nn.Module = self._shard(model, offload=self.offload)
        self.ref: nn.Module | None = None if ref is None else self._shard(ref, offload=params.ref_offload)
        if self._lora is not None and spec.need_reference:
            self.ref = lora.AdaptersOff(self._lora)
        self.teacher: nn.Module | None = (
            None if teacher is None else self._shard(teacher, offload=params.ref_offload)
        )
        self.critic: nn.Module | None = None if critic is None else self._shard(critic, offload=self.offload)

        self.optimizer = self._adamw(self.actor, spec.optim.lr, spec.optim.weight_decay)
        self.critic_optimizer = (
            None
            if self.critic is None
            else self._adamw(self.critic, spec.optim.critic_lr, spec.optim.critic_weight_decay)
        )
        self.schedule = LRSchedule.from_spec(spec)
        if self.rank == 0:
            logger.info(
                "fsdp2: world=%d mesh=%s ulysses_size=%d device=%s dtype=%s mixed_precision=%s offload=%s "
                "remove_padding=%s",
                self.world,
                tuple(self.mesh.mesh.shape),
                params.ulysses_size,
                self.device,
                params.dtype,
                self._mixed_precision(),
                self.offload,
                params.use_remove_padding,
            )

    @classmethod
    def from_module(
        cls, model: nn.Module, params: FSDP2Params | None = None, spec: TrainSpec | None = None, **kw: Any
    ) -> FSDP2TrainBackend:
        """A backend around an already built HF causal LM (tests, notebooks)."""
        return cls(params or FSDP2Params(), spec or TrainSpec(model_path=""), model=model, **kw)

    # -- construction ---------------------------------------------------------------------------
    def _make_mesh(self) -> DeviceMesh:
        size = self.world if self.params.fsdp_size == -1 else self.params.fsdp_size
        if self.world % size:
            raise ValueError(f"fsdp2: fsdp_size={size} does not divide the world size {self.world}")
        if size == self.world:
            return init_device_mesh(self.device.type, (self.world,), mesh_dim_names=("fsdp",))
        return init_device_mesh(
            self.device.type, (self.world // size, size), mesh_dim_names=("replicate", "fsdp")
        )

    def _make_sp_group(self) -> ulysses.UlyssesGroup | None:
        """The Ulysses SP group of this rank: ``ulysses_size`` consecutive ranks (a ``(dp, sp)`` mesh,
        as verl lays it out); None when ``ulysses_size`` is 1. FSDP2 still shards over ``self.mesh``."""
        size = self.params.ulysses_size
        if size == 1:
            return None
        problems = ulysses_problems(size, self.world)
        if problems:
            raise ValueError(f"fsdp2: ulysses_size: {problems[0]}")
        mesh = init_device_mesh(self.device.type, (self.world // size, size), mesh_dim_names=("dp", "sp"))
        return ulysses.UlyssesGroup(mesh["sp"].get_group(), size, self.rank % size)

    def _check_heads(self, config: Any, what: str) -> None:
        """Refuse a model whose attention / KV heads ``ulysses_size`` does not divide."""
        if self.sp is None:
            return
        cfg = getattr(config, "text_config", None) or config
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        problems = ulysses_problems(self.sp.size, None, heads=(heads, kv), where=what)
        if problems:
            raise ValueError(f"fsdp2: ulysses_size: {'; '.join(problems)}")

    @property
    def dp_world(self) -> int:
        """Data-parallel groups: every rank of an SP group takes the same samples."""
        return self.world // (1 if self.sp is None else self.sp.size)

    @property
    def dp_rank(self) -> int:
        return self.rank // (1 if self.sp is None else self.sp.size)

    def _mixed_precision(self) -> bool:
        return self.params.mixed_precision and self.device.type == "cuda"

    def _shard(self, module: nn.Module, *, offload: bool) -> nn.Module:
        """``fully_shard`` every decoder layer, then the root; gradients summed (divide factor 1)."""
        if self._mixed_precision():
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            mp = MixedPrecisionPolicy()
        if offload and self.device.type == "cuda":
            off: OffloadPolicy = CPUOffloadPolicy(pin_memory=True)
        else:
            off = OffloadPolicy()
        if not offload or self.device.type == "cpu":
            module = module.to(self.device)
        kw: dict[str, Any] = {
            "mesh": self.mesh,
            "mp_policy": mp,
            "offload_policy": off,
            "reshard_after_forward": self.params.reshard_after_forward,
        }
        for layer in _decoder_layers(module):
            fully_shard(layer, **kw)
        fully_shard(module, **kw)
        for m in module.modules():
            if isinstance(m, FSDPModule):
                # sum over ranks, never average: the objective already divides by global counts.
                # Plain SUM collectives (no PREMUL_SUM, which gloo lacks; a factor of 1 is a no-op).
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)
        return module

    def _adamw(self, module: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            [p for p in module.parameters() if p.requires_grad],
            lr=lr,
            betas=tuple(self.spec.optim.betas),  # type: ignore[arg-type]
            eps=self.spec.optim.eps,
            weight_decay=weight_decay,
        )

    def _hf_kwargs(self) -> dict[str, Any]:
        return models.hf_kwargs(self.params, self.spec, self.dtype)

    # -- planning -------------------------------------------------------------------------------
    def plan(self, batch: Batch, *, update: bool) -> ShardPlan:
        """This batch's shards and micro-batches (identical on every rank)."""
        mb = self.spec.micro_batch
        if update:
            return plan_shards(batch, self.dp_world, rows=mb.update_rows, max_tokens=mb.max_tokens)
        return plan_shards(batch, self.dp_world, rows=mb.log_prob_rows, max_tokens=None)

    def _my_micro_batches(self, batch: Batch, plan: ShardPlan) -> list[Batch | None]:
        """This rank's micro-batches on the device, ``None`` for the dummy passes that pad them
        (with Ulysses: its SP group's, the same on every rank of the group)."""
        shard = plan.shards[self.dp_rank]
        out: list[Batch | None] = [
            batch.select(shard[s:e]).to(self.device) for s, e in plan.bounds[self.dp_rank]
        ]
        return out + [None] * (plan.num_micro_batches - len(out))

    @staticmethod
    def _dummy(batch: Batch) -> Batch:
        return batch.select([0])

    # -- forward passes -------------------------------------------------------------------------
    def _actor_forward(
        self, module: nn.Module, mb: Batch, *, with_entropy: bool, temperature: float
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (+ entropy) ``[b, T]`` of one micro-batch on the device; zero on padding."""
        if self.sp is not None:
            return ulysses.sp_actor_log_probs(
                module,
                mb,
                self.sp,
                temperature=temperature,
                with_entropy=with_entropy,
                chunk_tokens=self.spec.micro_batch.log_prob_chunk,
            )
        return actor_log_probs(
            module,
            mb,
            keep_arg=self._teacher_keep_arg if module is self.teacher else self._keep_arg,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=self.spec.micro_batch.log_prob_chunk,
            packed=self.params.use_remove_padding,
        )

    def _actor_forward_sum_pi_squared(
        self, module: nn.Module, mb: Batch, *, temperature: float
    ) -> tuple[Tensor, Tensor]:
        """Log-probs and ``sum_v pi_v^2`` ``[b, T]`` of one micro-batch from one forward; zero on padding."""
        if self.sp is not None:
            return ulysses.sp_log_probs_and_sum_pi_squared(
                module,
                mb,
                self.sp,
                temperature=temperature,
                chunk_tokens=self.spec.micro_batch.log_prob_chunk,
            )
        return actor_log_probs_and_sum_pi_squared(
            module,
            mb,
            keep_arg=self._keep_arg,
            temperature=temperature,
            chunk_tokens=self.spec.micro_batch.log_prob_chunk,
            packed=self.params.use_remove_padding,
        )

    def _critic_forward(self, mb: Batch) -> Tensor:
        """Values ``[b, T]`` of one micro-batch (value at ``P - 1 + t``); zero on padding."""
        assert self.critic is not None
        if self.sp is not None:
            return ulysses.sp_critic_values(self.critic, mb, self.sp)
        return critic_values(self.critic, mb, packed=self.params.use_remove_padding)

    def _gather_rows(self, local: Tensor, plan: ShardPlan, width: int) -> Tensor:
        """All-gather every rank's ``[n_r, width]`` rows; return ``[B, width]`` in the original order
        (with Ulysses the ranks of an SP group hold the same rows: the first rank's are taken)."""
        rows = plan.max_shard
        padded = torch.zeros((rows, width), dtype=local.dtype, device=self.device)  # [rows, T]
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded)
        step = self.world // self.dp_world  # one rank per SP group
        full = torch.cat([p[: len(s)] for p, s in zip(parts[::step], plan.shards, strict=True)])  # [B, T]
        out = torch.empty_like(full)
        out[plan.order().to(self.device)] = full
        return out

    @torch.no_grad()
    def _inference(self, batch: Batch, forward: Forward, *, second: bool) -> tuple[Tensor, Tensor | None]:
        """Run ``forward`` over this rank's shard; all-gather its outputs (and the second, if asked)."""
        plan = self.plan(batch, update=False)
        T = batch["responses"].shape[1]
        outs: list[Tensor] = []
        seconds: list[Tensor] = []
        for mb in self._my_micro_batches(batch, plan):
            out, sec = forward(self._dummy(batch).to(self.device) if mb is None else mb)
            if mb is not None:
                outs.append(out.float())
                if second and sec is not None:
                    seconds.append(sec.float())
        empty = torch.zeros((0, T), device=self.device)
        result = self._gather_rows(torch.cat(outs) if outs else empty, plan, T)  # [B, T]
        extra = self._gather_rows(torch.cat(seconds) if seconds else empty, plan, T) if second else None
        return result, extra

    def compute_log_probs(
        self,
        batch: Batch,
        *,
        model: str = "actor",
        with_entropy: bool = False,
        temperature: float | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs ``[B, T]`` (+ entropy) of the responses on every rank (collective, no_grad).

        fp32, on this rank's device, zero on response padding; ``model``: "actor", "ref" or "teacher".
        """
        module = models.select_model(model, self.actor, self.ref, self.teacher)
        temp = self.temperature if temperature is None else temperature
        with eval_mode(module):
            return self._inference(
                batch,
                lambda mb: self._actor_forward(module, mb, with_entropy=with_entropy, temperature=temp),
                second=with_entropy,
            )

    def compute_log_probs_and_sum_pi_squared(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The actor's log-probs ``[B, T]`` (as :meth:`compute_log_probs`) and ``sum_v pi_v^2`` ``[B, T]``
        from the same forward, on every rank (collective, no_grad; fp32, zero on response padding)."""
        module = self.actor
        with eval_mode(module):
            lp, sps = self._inference(
                batch,
                lambda mb: self._actor_forward_sum_pi_squared(module, mb, temperature=self.temperature),
                second=True,
            )
        assert sps is not None
        return lp, sps

    def compute_values(self, batch: Batch) -> Tensor:
        """Critic values ``[B, T]`` on every rank (collective, no_grad; fp32, zero on padding)."""
        if self.critic is None:
            raise ValueError("compute_values: no critic (spec.need_critic=False)")
        with eval_mode(self.critic):
            values, _ = self._inference(batch, lambda mb: (self._critic_forward(mb), None), second=False)
        return values

    # -- updates --------------------------------------------------------------------------------
    def update_policy(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        """One actor optimizer step over ``mini_batch`` (collective) at ``schedule.lr(version)``;
        ``version`` counts the steps not skipped. Metrics as the native backend: the objective's +
        ``actor/loss`` (sum over micro-batches and ranks), ``actor/grad_norm``, ``actor/lr``,
        ``actor/skipped_steps``, ``actor/num_micro_batches`` (per rank)."""
        with_entropy = update.needs_entropy(objective)
        actor, temperature = self.actor, self.temperature

        def forward(mb: Batch) -> tuple[Tensor, Tensor | None]:
            return self._actor_forward(actor, mb, with_entropy=with_entropy, temperature=temperature)

        target = Target.at_step("actor", actor, self.optimizer, self.schedule, self.version, self.spec.optim)
        metrics = self._step(target, mini_batch, objective, forward)
        self.version += target.taken(metrics)
        return metrics

    def update_critic(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        """One critic optimizer step (collective) at ``schedule.lr(critic_steps, critic=True)``:
        ``loss, metrics = objective(mb, values, None)``; ``critic_steps`` counts the steps not skipped."""
        if self.critic is None or self.critic_optimizer is None:
            raise ValueError("update_critic: no critic (spec.need_critic=False)")
        critic, optimizer, steps = self.critic, self.critic_optimizer, self.critic_steps
        target = Target.at_step("critic", critic, optimizer, self.schedule, steps, self.spec.optim)
        metrics = self._step(target, mini_batch, objective, lambda mb: (self._critic_forward(mb), None))
        self.critic_steps += target.taken(metrics)
        return metrics

    def _step(
        self, target: Target, mini_batch: Batch, objective: Objective, forward: Forward
    ) -> dict[str, float]:
        """One optimizer step of ``target`` over this rank's micro-batches (padded with dummy passes)."""
        plan = self.plan(mini_batch, update=True)
        return update.run_update(
            target,
            self._my_micro_batches(mini_batch, plan),
            objective,
            forward,
            device=self.device,
            num_micro_batches=plan.num_micro_batches,
            ranks=ProcessGroupRanks(self.rank, self.world, self.device, sp=self.world // self.dp_world),
            dummy=lambda: self._dummy(mini_batch).to(self.device),  # pad this rank's passes
        )

    # -- weights --------------------------------------------------------------------------------
    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """``(name, full tensor)`` of the actor's HF state dict, one parameter at a time.

        **Collective**: every rank must iterate the generator to its end, in step. Each tensor is
        all-gathered (``DTensor.full_tensor()``), yielded on rank 0 only and dropped on the other
        ranks, so at most one full parameter exists at a time on each rank besides what rank 0's
        consumer keeps. Tensors are in the stored dtype (``params.dtype``), on this rank's device,
        freshly allocated (safe to keep). Tied weights appear under every name, as in
        ``state_dict()``; rank != 0 yields nothing. With LoRA: the adapter tensors only.
        """
        state = self.actor.state_dict()
        for name, t in state.items() if self._lora is None else lora.adapter_items(state):
            if isinstance(t, DTensor):
                if t.device.type != self.device.type:  # offloaded shard: gather on the device
                    t = cast(DTensor, t.to(self.device))  # .to keeps a DTensor (typed as Tensor)
                full = t.full_tensor()
            else:
                full = t.detach()
            if self.rank == 0:
                yield name, full.detach()
            del full

    def full_state_dict(self) -> dict[str, Tensor]:
        """The actor's full state dict on CPU on rank 0 (collective; empty on the other ranks)."""
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return dict(get_model_state_dict(self.actor, options=opts))  # type: ignore[arg-type]

    def export_hf(self, path: str | Path) -> None:
        """``save_pretrained`` of the gathered actor (safetensors) + tokenizer, by rank 0 (collective).
        With LoRA: the merged model, and the adapter alone in ``adapter/`` (a PEFT folder)."""
        state = self.full_state_dict()
        if self.rank == 0 and self._lora is not None:
            with ckpt.atomic_dir(Path(path), {"format": "hf"}) as tmp:
                ckpt.save_lora_export(state, self._actor_cls, self._actor_config, self.spec, tmp)
                ckpt.save_tokenizer(self._tokenizer, self.spec, tmp)
        elif self.rank == 0:
            with ckpt.atomic_dir(Path(path), {"format": "hf"}) as tmp:
                ckpt.save_hf_model(state, self._actor_cls, self._actor_config, tmp, what="the gathered state")
                ckpt.save_tokenizer(self._tokenizer, self.spec, tmp)
        dist.barrier()

    # -- checkpoints ----------------------------------------------------------------------------
    def _parts(self) -> list[tuple[str, nn.Module, torch.optim.Optimizer]]:
        parts: list[tuple[str, nn.Module, torch.optim.Optimizer]] = [("actor", self.actor, self.optimizer)]
        if self.critic is not None and self.critic_optimizer is not None:
            parts.append(("critic", self.critic, self.critic_optimizer))
        return parts

    def _state_options(self, module: nn.Module) -> StateDictOptions | None:
        """With LoRA the actor's checkpoint holds its trainable (adapter) tensors only; loading
        sets those (``dcp.load`` fails on one the checkpoint lacks) and leaves the frozen base."""
        if module is self.actor and self._lora is not None:
            return StateDictOptions(ignore_frozen_params=True, strict=False)
        return None

    def _state_dicts(self, module: nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], Any]:
        """``get_state_dict`` of a checkpoint part; for a LoRA actor the adapter tensors only
        (``ignore_frozen_params`` alone keeps a tied LM head, whose name is not its parameter's)."""
        model_sd, optim_sd = get_state_dict(module, opt, options=self._state_options(module))
        if module is self.actor and self._lora is not None:
            model_sd = dict(lora.adapter_items(cast(dict[str, Tensor], model_sd)))  # a model's: tensors
        return dict(model_sd), optim_sd

    def save_checkpoint(self, path: Path, extra_state: Mapping[str, Any]) -> None:
        """Write a sharded checkpoint to ``path`` atomically (collective; ``path`` on a shared FS).

        Layout: ``actor/`` and ``critic/`` are ``torch.distributed.checkpoint`` directories (model +
        optimizer, resharding-capable), ``rng_rank{r}.{json,safetensors}`` per rank, ``meta.json``
        (version, schedule, world size, extra_state), ``COMPLETE`` last; written in ``PATH.tmp`` by
        all ranks and renamed by rank 0 only after every rank finished.
        """
        meta = ckpt.checkpoint_meta(
            CHECKPOINT_FORMAT,
            extra_state,
            version=self.version,
            critic_steps=self.critic_steps,
            schedule=self.schedule,
            has_critic=self.critic is not None,
            world_size=self.world,
            lora=lora.settings_record(self.spec.lora),
        )
        # extra_state must be the same on every rank; rank 0's is the one written.
        box: list[Any] = [None]

        def write(tmp: Path) -> None:
            for name, module, opt in self._parts():
                model_sd, optim_sd = self._state_dicts(module, opt)
                dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / name))
            ckpt.save_tree(ckpt.rng_state(), tmp, f"rng_rank{self.rank}")
            dist.barrier()

        if self.rank == 0:
            with ckpt.atomic_dir(Path(path), {"format": CHECKPOINT_FORMAT, "world_size": self.world}) as tmp:
                box[0] = str(tmp)
                dist.broadcast_object_list(box, src=0)
                write(tmp)
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        else:
            dist.broadcast_object_list(box, src=0)
            write(Path(box[0]))
        dist.barrier()  # nobody returns before the checkpoint is complete

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore weights, optimizer states, schedule, ``version`` and RNG (collective).

        The world size may differ from the saving run's (DCP reshards model and optimizer); RNG
        states then come from rank ``r % saved_world``. Returns ``extra_state``.
        """
        path = Path(path)
        meta = ckpt.read_checkpoint_meta(
            path, CHECKPOINT_FORMAT, "an fsdp2 train", has_critic=self.critic is not None
        )
        ckpt.check_checkpoint_lora(path, meta, self.spec.lora)
        for name, module, opt in self._parts():
            options = self._state_options(module)
            model_sd, optim_sd = self._state_dicts(module, opt)
            state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=str(path / name))
            set_state_dict(
                module,
                opt,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=options,
            )
        self.version = int(meta["version"])
        self.critic_steps = int(meta["scheduler"]["critic"]["steps"])
        ckpt.set_rng_state(ckpt.load_tree(path, f"rng_rank{self.rank % int(meta['world_size'])}"))
        dist.barrier()
        return dict(meta["extra_state"])

    def shutdown(self) -> None:
        """Drop models and optimizer states; destroy the process group if this backend made it."""
        for attr in ("actor", "ref", "teacher", "critic", "optimizer", "critic_optimizer", "_lora"):
            setattr(self, attr, None)
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
