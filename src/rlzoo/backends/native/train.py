"""The native train backend: one process, one device, any HF causal LM.

Log-probs of response token ``t`` come from the logits at position ``P - 1 + t`` (the position
before it), values likewise from the hidden state at ``P - 1 + t`` (as verl does). Each
micro-batch is trimmed to the columns any of its rows attends to (common left padding of the
prompt, common right padding of the response) before the forward pass, and only the ``T + 1``
last positions go through the LM head (``logits_to_keep``), so the prompt's logits are never
materialised. Outputs are zero where the response is padding.

Updates: ``update_policy`` / ``update_critic`` run the step here, handing this backend's forward
to the core train kit's micro-batch loop (:mod:`rlzoo.train_kit.update`): ``loss.backward()`` per
micro-batch, gradients accumulate unscaled (the objective normalises by the mini-batch's global
counts), then one optimizer step unless the loss or the gradient norm is not finite (then the step
is skipped and the gradients dropped). The LR schedule is a pure function of the number of
optimizer steps taken, which this backend counts. The other pieces are the kit's too
(:mod:`rlzoo.train_kit`); vision-language forwards are this backend's own (:mod:`.multimodal`).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.protocols import Objective
from rlzoo.kernel.settings import TrainSpec
from rlzoo.train_kit import attention, lora, models, update
from rlzoo.train_kit import checkpoint as ckpt
from rlzoo.train_kit.fastest import resolve_autocast
from rlzoo.train_kit.logprobs import (
    actor_log_probs,
    actor_log_probs_and_divergence,
    actor_log_probs_and_sum_pi_squared,
    critic_values,
)
from rlzoo.train_kit.modes import eval_mode
from rlzoo.train_kit.update import Forward, LRSchedule, Target

__all__ = ["NativeTrainBackend"]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "rlzoo-native-train/1"


# ---------------------------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------------------------
class NativeTrainBackend:
    """Actor (+ frozen reference, + critic) trained in this process. See the module docstring.

    ``version`` is the number of actor optimizer steps taken (skipped steps do not count).
    """

    def __init__(
        self,
        params: NativeTrainParams,
        spec: TrainSpec,
        *,
        model: nn.Module | None = None,
        critic_backbone: nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        """Load the actor from ``spec.model_path``, or use ``model`` (an HF causal LM module).

        ``critic_backbone`` overrides the critic's backbone (default: loaded from
        ``spec.critic_model_path``, or the actor's base model copied when ``model`` is given and
        no critic path is). ``tokenizer`` is saved by :meth:`export_hf` (default: loaded from
        ``spec.model_path`` when it has one). With ``spec.lora`` the adapters are injected into
        the actor (``model`` too, when given) in place (:func:`rlzoo.train_kit.lora.apply_lora`).
        """
        self.params = params
        self.spec = spec
        self.temperature = models.resolve_temperature(params.temperature, spec)
        self.version = 0
        self.critic_steps = 0
        self.device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if params.device == "auto" else params.device
        )
        self.dtype = models.DTYPES[params.dtype]
        self._bf16_autocast = resolve_autocast(params.autocast, self.device.type)
        self._tokenizer = tokenizer

        given_model = model is not None
        if model is None:
            model = models.load_causal_lm(spec.model_path, self._hf_kwargs())
        self.actor: Any = model.to(device=self.device, dtype=self.dtype)  # an HF PreTrainedModel
        from rlzoo.backends.native.multimodal import is_multimodal_model, vision_tower

        # a vision-language model (Qwen2.5-VL style): images and M-RoPE positions in every forward
        self._vl = is_multimodal_model(self.actor)
        if params.freeze_vision_tower:
            tower = vision_tower(self.actor) if self._vl else None
            if tower is None:
                raise ConfigError(
                    f"trainer.backend.freeze_vision_tower=true needs a vision-language model with a vision "
                    f"tower (e.g. Qwen2.5-VL); {type(self.actor).__name__} has none: drop the setting"
                )
            tower.requires_grad_(False)  # no gradients, and the optimizer below takes trainable weights only
        if self._vl and params.use_remove_padding:
            logger.info(
                "use_remove_padding: %s is a vision-language model; its forwards stay padded",
                type(model).__name__,
            )
        # packed rows attend per sequence (before the reference / critic copies, which inherit it)
        packed_attention = params.use_remove_padding and not self._vl
        if packed_attention:
            attention.install(self.actor, what="actor")
        if self._vl and spec.need_critic:
            raise NotImplementedError(
                f"native train backend: a critic (value model) for the vision-language model "
                f"{type(self.actor).__name__} is not supported yet (the critic's backbone would need "
                "the images and M-RoPE positions too); use a critic-free advantage (e.g. grpo) with VL models"
            )
        # the initial weights, before any update (with LoRA: the actor with its adapters off, below)
        self.ref: nn.Module | None = None
        if spec.need_reference and spec.lora is None:
            self.ref = copy.deepcopy(self.actor).eval().requires_grad_(False)
        self.critic: models.CriticModel | None = None
        if spec.need_critic:
            backbone: Any = models.critic_backbone(
                spec, critic_backbone, self.actor, given_model=given_model, kwargs=self._hf_kwargs()
            )
            hidden = int(backbone.config.hidden_size)
            if packed_attention:
                attention.install(backbone, what="critic")
            self.critic = models.CriticModel(backbone.to(self.dtype), hidden).to(self.device)
        # LoRA: adapters injected into the actor in place (after the critic copied a clean base)
        self._lora: Any = None
        if spec.lora is not None:
            self._lora = lora.apply_lora(self.actor, spec.lora, seed=spec.seed)
            self.actor.to(device=self.device, dtype=self.dtype)
            if spec.need_reference:
                self.ref = lora.AdaptersOff(self._lora)
        # a forward-only teacher (algorithm.teacher), placed like the reference: on this device
        self.teacher: nn.Module | None = None
        if spec.teacher is not None:
            if self._vl:
                raise NotImplementedError(
                    f"native train backend: a teacher for the vision-language model {type(self.actor).__name__} "
                    "is not supported yet (algorithm.teacher works with text models)"
                )
            self.teacher = models.load_teacher(spec.teacher, params, spec, self.dtype).to(self.device)
            if packed_attention:
                attention.install(self.teacher, what="teacher")

        if params.gradient_checkpointing:
            m: Any
            for m in (self.actor, self.critic.backbone if self.critic is not None else None):
                if m is None:
                    continue
                if hasattr(m, "activation_checkpointing_enable"):  # transformers >= 5
                    m.activation_checkpointing_enable({"use_reentrant": False})
                else:
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._keep_arg = models.takes_logits_to_keep(self.actor)
        self._teacher_keep_arg = self.teacher is not None and models.takes_logits_to_keep(self.teacher)
        # the LM head applied per chunk inside the log-softmax (the ref model has the same architecture)
        self._fuse = params.fused_lm_head and not self._vl and models.fusable_lm_head(self.actor) is not None
        if params.fused_lm_head and not self._vl and not self._fuse:
            logger.info(
                "fused_lm_head: %s is not one of %s; log-probs come from its logits",
                type(self.actor).__name__,
                sorted(models.FUSED_LM_HEAD_MODEL_TYPES),
            )

        # foreach: one multi-tensor step instead of a Python loop over the parameters (torch's
        # default only on CUDA); the same arithmetic, bit for bit, and cheaper for many small tensors
        self.optimizer = torch.optim.AdamW(
            [p for p in self.actor.parameters() if p.requires_grad],
            lr=spec.optim.lr,
            betas=tuple(spec.optim.betas),  # type: ignore[arg-type]
            eps=spec.optim.eps,
            weight_decay=spec.optim.weight_decay,
            foreach=True,
        )
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if self.critic is not None:
            self.critic_optimizer = torch.optim.AdamW(
                self.critic.parameters(),
                lr=spec.optim.critic_lr,
                betas=tuple(spec.optim.betas),  # type: ignore[arg-type]
                eps=spec.optim.eps,
                weight_decay=spec.optim.critic_weight_decay,
                foreach=True,
            )
        self.schedule = LRSchedule.from_spec(spec)

    @classmethod
    def from_module(
        cls,
        model: nn.Module,
        params: NativeTrainParams | None = None,
        spec: TrainSpec | None = None,
        **kw: Any,
    ) -> NativeTrainBackend:
        """A backend around an already built HF causal LM (tests, notebooks)."""
        return cls(params or NativeTrainParams(), spec or TrainSpec(model_path=""), model=model, **kw)

    # -- loading --------------------------------------------------------------------------------
    def _hf_kwargs(self) -> dict[str, Any]:
        return models.hf_kwargs(self.params, self.spec, self.dtype)

    # -- forward passes -------------------------------------------------------------------------
    def _actor_forward(
        self, module: nn.Module, mb: Batch, *, with_entropy: bool, temperature: float
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (+ entropy) ``[b, T]`` of one micro-batch already on the device."""
        chunk = self.spec.micro_batch.log_prob_chunk
        with self._autocast():
            if self._vl:
                from rlzoo.backends.native.multimodal import vl_actor_log_probs

                return vl_actor_log_probs(
                    module,
                    mb,
                    temperature=temperature,
                    with_entropy=with_entropy,
                    vision_dtype=self.dtype,
                    chunk_tokens=chunk,
                )
            return actor_log_probs(
                module,
                mb,
                keep_arg=self._teacher_keep_arg if module is self.teacher else self._keep_arg,
                temperature=temperature,
                with_entropy=with_entropy,
                chunk_tokens=chunk,
                packed=self.params.use_remove_padding,
                lm_head=models.fusable_lm_head(module) if self._fuse else None,  # actor's or ref's
                matmul_dtype=torch.bfloat16 if self._bf16_autocast else None,
            )

    def _divergence_forward(
        self, module: nn.Module, mb: Batch, divergence: Any, *, with_entropy: bool, temperature: float
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """Log-probs (+ entropy) and the divergence to the teacher ``[b, T]`` of one micro-batch
        (:func:`rlzoo.train_kit.logprobs.actor_log_probs_and_divergence`); padded text forwards."""
        if self.teacher is None:
            raise ValueError(
                "update_policy: the objective wants a divergence to the teacher (a needs_teacher_distribution "
                "policy loss), but this backend has no teacher (spec.teacher is None)"
            )
        if self._vl:
            raise NotImplementedError("native train backend: a teacher divergence for vision-language models")
        with self._autocast():
            return actor_log_probs_and_divergence(
                module,
                self.teacher,
                mb,
                divergence,
                keep_arg=self._keep_arg,
                teacher_keep_arg=self._teacher_keep_arg,
                temperature=temperature,
                with_entropy=with_entropy,
                chunk_tokens=self.spec.micro_batch.log_prob_chunk,
            )

    def _critic_forward(self, mb: Batch) -> Tensor:
        assert self.critic is not None
        with self._autocast():
            return critic_values(self.critic, mb, packed=self.params.use_remove_padding).float()

    def _autocast(self) -> Any:
        """``torch.autocast`` in bf16 when ``params.autocast`` asks for it (log-softmax stays fp32)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._bf16_autocast)

    @torch.no_grad()
    def compute_log_probs(
        self,
        batch: Batch,
        *,
        model: str = "actor",
        with_entropy: bool = False,
        temperature: float | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs ``[B, T]`` (and entropy ``[B, T]`` if asked) of the responses, under no_grad.

        fp32, on the input batch's device, zero where the response is padding. ``model``: "actor",
        "ref" or "teacher"; ``temperature`` defaults to ``params.temperature``.
        """
        module = models.select_model(model, self.actor, self.ref, self.teacher)
        temp = self.temperature if temperature is None else temperature
        lps, ents = [], []
        with eval_mode(module):
            for mb in batch.split(self.spec.micro_batch.log_prob_rows):
                lp, ent = self._actor_forward(
                    module, mb.to(self.device), with_entropy=with_entropy, temperature=temp
                )
                lps.append(lp)
                ents.append(ent)
        out_device = batch["input_ids"].device
        entropy = torch.cat(ents).to(out_device) if with_entropy else None  # type: ignore[arg-type]
        return torch.cat(lps).to(out_device), entropy

    @torch.no_grad()
    def compute_log_probs_and_sum_pi_squared(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The actor's log-probs ``[B, T]`` (as :meth:`compute_log_probs`) and ``sum_v pi_v^2``
        ``[B, T]`` of the same distribution, from one forward per micro-batch
        (:class:`rlzoo.kernel.protocols.SumPiSquaredSource`); fp32, zero on response padding."""
        module = self.actor
        was_training = module.training
        module.eval()
        lps, spss = [], []
        for mb in batch.split(self.spec.micro_batch.log_prob_rows):
            with self._autocast():
                lp, sps = actor_log_probs_and_sum_pi_squared(
                    module,
                    mb.to(self.device),
                    keep_arg=self._keep_arg,
                    temperature=self.temperature,
                    vision=self._vl,
                    chunk_tokens=self.spec.micro_batch.log_prob_chunk,
                    packed=self.params.use_remove_padding,
                )
            lps.append(lp)
            spss.append(sps)
        module.train(was_training)
        out_device = batch["input_ids"].device
        return torch.cat(lps).to(out_device), torch.cat(spss).to(out_device)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Tensor:
        """Critic values ``[B, T]`` (fp32, on the batch's device, zero on response padding).

        The value of response token ``t`` is the value head at position ``P - 1 + t``.
        """
        if self.critic is None:
            raise ValueError("compute_values: no critic (spec.need_critic=False)")
        with eval_mode(self.critic):
            out = [
                self._critic_forward(mb.to(self.device))
                for mb in batch.split(self.spec.micro_batch.log_prob_rows)
            ]
        return torch.cat(out).to(batch["input_ids"].device)

    # -- updates --------------------------------------------------------------------------------
    def micro_batches(self, mini_batch: Batch) -> list[Batch]:
        """The update's micro-batches: ``micro_batch_size`` rows, or packed by real-token count."""
        limit = self.spec.micro_batch.max_tokens
        if limit is None:
            return mini_batch.split(self.spec.micro_batch.update_rows)
        tokens = mini_batch["attention_mask"].sum(-1).tolist()  # [B]
        out, start, used = [], 0, 0
        for i, n in enumerate(tokens):  # scheduling over B ints, not tensor math
            if i > start and used + n > limit:
                out.append(mini_batch.select(slice(start, i)))
                start, used = i, 0
            used += n
        out.append(mini_batch.select(slice(start, len(mini_batch))))
        return out

    def update_policy(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        """One actor optimizer step over ``mini_batch`` at ``schedule.lr(version)``; ``version``
        counts the steps not skipped. Metrics: the objective's (mean over micro-batches) +
        ``actor/loss`` (sum), ``actor/grad_norm``, ``actor/lr``, ``actor/skipped_steps``,
        ``actor/num_micro_batches``."""
        with_entropy = update.needs_entropy(objective)
        actor, temperature = self.actor, self.temperature
        divergence = update.teacher_divergence(objective)

        def forward(mb: Batch) -> tuple[Tensor, Tensor | None]:
            if divergence is not None:  # the teacher's whole distribution: one more forward, no_grad
                lp, ent, mb["teacher_divergence"] = self._divergence_forward(
                    actor, mb, divergence, with_entropy=with_entropy, temperature=temperature
                )
                return lp, ent
            return self._actor_forward(actor, mb, with_entropy=with_entropy, temperature=temperature)

        target = Target.at_step("actor", actor, self.optimizer, self.schedule, self.version, self.spec.optim)
        metrics = self._step(target, mini_batch, objective, forward)
        self.version += target.taken(metrics)
        return metrics

    def update_critic(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        """One critic optimizer step at ``schedule.lr(critic_steps, critic=True)``:
        ``loss, metrics = objective(micro_batch, values, None)``; ``critic_steps`` counts the steps
        not skipped."""
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
        """One optimizer step of ``target`` over this backend's micro-batches of ``mini_batch``."""
        mbs = self.micro_batches(mini_batch)
        return update.run_update(
            target,
            (mb.to(self.device) for mb in mbs),
            objective,
            forward,
            device=self.device,
            num_micro_batches=len(mbs),
        )

    # -- weights --------------------------------------------------------------------------------
    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """``(name, tensor)`` of the actor's HF state dict, detached, on the backend's device; with
        LoRA only the adapter tensors (:func:`rlzoo.train_kit.lora.adapter_items`).

        The tensors alias the live parameters: copy them before the next update. Tied weights
        appear under every name (as in ``state_dict()``).
        """
        state = self.actor.state_dict()
        for name, t in state.items() if self._lora is None else lora.adapter_items(state):
            yield name, t.detach()

    def export_hf(self, path: str | Path) -> None:
        """``save_pretrained`` of the actor (safetensors) + the tokenizer when one is known. With
        LoRA: the merged model, and the adapter alone in ``adapter/`` (a PEFT folder)."""
        path = Path(path)
        with ckpt.atomic_dir(path, {"format": "hf"}) as tmp:
            if self._lora is None:
                self.actor.save_pretrained(str(tmp))
            else:
                ckpt.save_lora_export(
                    self.actor.state_dict(), type(self.actor), self.actor.config, self.spec, tmp
                )
            ckpt.save_tokenizer(self._tokenizer, self.spec, tmp)

    def _actor_state(self) -> dict[str, Tensor]:
        """What a checkpoint holds of the actor: every tensor, or with LoRA the adapter only."""
        state = self.actor.state_dict()
        return state if self._lora is None else dict(lora.adapter_items(state))

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, path: Path, extra_state: Mapping[str, Any]) -> None:
        """Write a complete checkpoint to ``path`` atomically (see :meth:`load_checkpoint`)."""
        meta = ckpt.checkpoint_meta(
            CHECKPOINT_FORMAT,
            extra_state,
            version=self.version,
            critic_steps=self.critic_steps,
            schedule=self.schedule,
            has_critic=self.critic is not None,
            lora=lora.settings_record(self.spec.lora),
        )
        with ckpt.atomic_dir(Path(path), {"format": CHECKPOINT_FORMAT}) as tmp:
            parts: list[tuple[str, nn.Module, torch.optim.Optimizer]] = [
                ("actor", self.actor, self.optimizer)
            ]
            if self.critic is not None and self.critic_optimizer is not None:
                parts.append(("critic", self.critic, self.critic_optimizer))
            for name, module, opt in parts:
                (tmp / name).mkdir()
                state = self._actor_state() if module is self.actor else module.state_dict()
                ckpt.save_state_dict(state, tmp / name / "model.safetensors")
                ckpt.save_tree(opt.state_dict(), tmp / name, "optimizer")
            ckpt.save_tree(ckpt.rng_state(), tmp, "rng")
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore weights, optimizer states, schedule position, ``version`` and RNG states.

        Returns the ``extra_state`` given to :meth:`save_checkpoint`. Raises
        :class:`~rlzoo.train_kit.checkpoint.IncompleteCheckpointError` when ``path`` has
        no ``COMPLETE`` marker. The reference model is not in the checkpoint: it is the initial
        weights this backend was built from (the teacher is not either: it is loaded from its folder). With LoRA the checkpoint holds the adapter and its
        optimizer state only: the base weights come from ``model_path`` again.
        """
        path = Path(path)
        meta = ckpt.read_checkpoint_meta(
            path, CHECKPOINT_FORMAT, "a native train", has_critic=self.critic is not None
        )
        ckpt.check_checkpoint_lora(path, meta, self.spec.lora)
        parts: list[tuple[str, nn.Module, torch.optim.Optimizer]] = [("actor", self.actor, self.optimizer)]
        if self.critic is not None and self.critic_optimizer is not None:
            parts.append(("critic", self.critic, self.critic_optimizer))
        for name, module, opt in parts:
            state = ckpt.load_state_dict(path / name / "model.safetensors", device=self.device)
            if module is self.actor and self._lora is not None:
                ckpt.load_adapter_state(module, state)
            else:
                module.load_state_dict(state, strict=True)
            opt.load_state_dict(ckpt.load_tree(path / name, "optimizer"))
        self.version = int(meta["version"])
        self.critic_steps = int(meta["scheduler"]["critic"]["steps"])
        ckpt.set_rng_state(ckpt.load_tree(path, "rng"))
        return dict(meta["extra_state"])

    def shutdown(self) -> None:
        """Drop the models and optimizer states (frees device memory)."""
        for attr in ("actor", "ref", "teacher", "critic", "optimizer", "critic_optimizer", "_lora"):
            setattr(self, attr, None)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
