"""The native train backend: one process, one device, any HF causal LM.

Log-probs of response token ``t`` come from the logits at position ``P - 1 + t`` (the position
before it), values likewise from the hidden state at ``P - 1 + t`` (as verl does). Each
micro-batch is trimmed to the columns any of its rows attends to (common left padding of the
prompt, common right padding of the response) before the forward pass, and only the ``T + 1``
last positions go through the LM head (``logits_to_keep``), so the prompt's logits are never
materialised. Outputs are zero where the response is padding.

Updates: ``loss.backward()`` per micro-batch, gradients accumulate unscaled (the objective
normalises by the mini-batch's global counts), then one optimizer step unless the loss or the
gradient norm is not finite (then the step is skipped and the gradients dropped). The LR schedule
is a pure function of the number of optimizer steps taken (:func:`lr_multiplier`).
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlzoo import lora
from rlzoo.backends.native import checkpoint as ckpt
from rlzoo.backends.native import common
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.batch import Batch
from rlzoo.protocols import Objective, TrainSpec
from rlzoo.train_kit import (
    DEFAULT_LOG_PROB_CHUNK,
    Packed,
    linear_token_log_probs,
    pack,
    token_log_probs,
    unpack,
)

__all__ = [
    "CriticModel",
    "NativeTrainBackend",
    "actor_log_probs",
    "actor_log_probs_and_sum_pi_squared",
    "critic_values",
    "fusable_lm_head",
    "lr_multiplier",
    "packed_response_logits",
    "pad_response",
    "response_logits",
    "token_log_probs",
    "trim",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "rlzoo-native-train/1"
FUSED_LM_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})
"""HF model types whose causal-LM logits are exactly ``lm_head(decoder(...).last_hidden_state)``
(no logit scaling or soft-capping after the head)."""
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------------------------------------
# pure helpers
# ---------------------------------------------------------------------------------------------
def lr_multiplier(
    step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> float:
    """LR of optimizer step ``step`` (0-based) as a fraction of the peak LR.

    verl / HF conventions (``verl/utils/torch_functional.py``), ``W`` warmup steps, ``N`` total::

        constant: s < W: s / W                 else 1
        linear:   s < W: m + (1 - m) s / W     else m + (1 - m) max(0, (N - s) / (N - W))
        cosine:   s < W: m + (1 - m) s / W     else m + (1 - m) (1 + cos(pi p)) / 2,
                  p = min(1, (s - W) / (N - W))

    (the first warmup step has multiplier ``m``, 0 by default, as in HF).
    """
    m = 0.0 if schedule == "constant" else min_lr_ratio
    if step < warmup_steps:
        return m + (1.0 - m) * step / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    decay = max(1, total_steps - warmup_steps)
    if schedule == "linear":
        return m + (1.0 - m) * max(0.0, (total_steps - step) / decay)
    if schedule == "cosine":
        p = min(1.0, (step - warmup_steps) / decay)
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def trim(mb: Batch) -> tuple[Tensor, Tensor, Tensor, int, int]:
    """Columns of a micro-batch that any row attends to.

    Returns ``(input_ids, attention_mask, position_ids, T_eff, resp_start)`` where the trimmed
    tensors are ``[b, P' + T_eff]`` and position ``resp_start - 1 + t`` predicts response token t.
    """
    ids = mb["input_ids"]  # [b, P+T]
    attn = mb["attention_mask"]  # [b, P+T]
    T = mb["responses"].shape[1]
    P = ids.shape[1] - T
    if "position_ids" in mb:
        pos = mb["position_ids"]  # [b, P+T]
    else:
        pos = (attn.long().cumsum(-1) - 1).clamp(min=0)  # [b, P+T]
    cols = attn.bool().any(0)  # [P+T]
    prompt_cols = cols[:P].nonzero()
    start = min(int(prompt_cols[0]) if len(prompt_cols) else P - 1, max(P - 1, 0))
    resp_cols = cols[P:].nonzero()
    t_eff = max(1, int(resp_cols[-1]) + 1 if len(resp_cols) else 1)
    end = P + t_eff
    return ids[:, start:end], attn[:, start:end], pos[:, start:end], t_eff, P - start


_trim = trim  # the former private name


def pad_response(x: Tensor, mb: Batch) -> Tensor:
    """``[b, T_eff]`` per-token outputs of :func:`trim`'s columns back to ``[b, T]``, zero on padding."""
    T = mb["responses"].shape[1]
    valid = mb["attention_mask"][:, -T:].bool()  # [b, T]
    return torch.where(valid, F.pad(x, (0, T - x.shape[1])), 0.0)  # [b, T]


def actor_log_probs(
    module: nn.Module,
    mb: Batch,
    *,
    keep_arg: bool,
    temperature: float,
    with_entropy: bool,
    vision_dtype: torch.dtype | None = None,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
    packed: bool = False,
    lm_head: nn.Linear | None = None,
    matmul_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (+ entropy) ``[b, T]`` of one micro-batch already on the device; zero on padding.

    ``lm_head`` (from :func:`fusable_lm_head`, text models, ``chunk_tokens > 0``): the decoder's
    hidden states go through :func:`rlzoo.train_kit.linear_token_log_probs` (the LM head applied
    per chunk; the logits are never built), the matmul in ``matmul_dtype`` (default: the hidden
    states' dtype; bf16 under autocast, as the head would run).

    Padded forward over the :func:`trim` columns, or (``packed``, text models) one padding-free
    forward (:func:`packed_response_logits`); ``keep_arg``: the module's forward takes
    ``logits_to_keep``; ``chunk_tokens``: :func:`rlzoo.train_kit.token_log_probs`'s chunks. ``vision_dtype`` set: ``module`` is a vision-language model, the rows'
    images (``mb["multi_modal"]``, concatenated in row order, pixels cast to ``vision_dtype``) go
    into the forward and positions are M-RoPE ones computed from the ids (``mb["position_ids"]``
    is ignored).
    """
    if vision_dtype is not None:
        from rlzoo.backends.native.multimodal import collate_images, vl_token_log_probs

        images = collate_images(mb.get("multi_modal") or [None] * len(mb), device=mb["input_ids"].device)
        if "pixel_values" in images:
            images["pixel_values"] = images["pixel_values"].to(vision_dtype)
        # columns no row attends to are cut as in the text path: M-RoPE positions only count
        # attended tokens, so the result is the same as over the untrimmed micro-batch
        ids, attn, _, t_eff, _ = trim(mb)
        lp, ent = vl_token_log_probs(
            module,
            ids,
            attn,
            mb["responses"][:, :t_eff],
            images,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
        )  # [b, T_eff]
    elif lm_head is not None and chunk_tokens > 0:
        hidden, targets, pk = response_hidden(module, mb, packed=packed)  # [r, t, H], [r, t]
        if matmul_dtype is not None:
            hidden = hidden.to(matmul_dtype)
        lp, ent = linear_token_log_probs(
            hidden,
            lm_head.weight,
            targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
        )
        if pk is not None:
            return unpack(lp[0], pk.response_valid), None if ent is None else unpack(
                ent[0], pk.response_valid
            )
    elif packed:
        logits, pk = packed_response_logits(module, mb, keep_arg=keep_arg)  # [1, n, V]
        lp, ent = token_log_probs(
            logits,
            pk.targets[None],
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
        )  # [1, n]
        return unpack(lp[0], pk.response_valid), None if ent is None else unpack(ent[0], pk.response_valid)
    else:
        logits, targets = response_logits(module, mb, keep_arg=keep_arg)  # [b, T_eff, V], [b, T_eff]
        lp, ent = token_log_probs(
            logits, targets, temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens
        )
    return pad_response(lp, mb), None if ent is None else pad_response(ent, mb)  # [b, T]


def response_logits(module: nn.Module, mb: Batch, *, keep_arg: bool) -> tuple[Tensor, Tensor]:
    """Logits ``[b, T_eff, V]`` that predict the response tokens ``[b, T_eff]`` of a text micro-batch
    (padded forward over the :func:`trim` columns; position ``P - 1 + t`` predicts token ``t``).

    ``keep_arg``: only those positions go through the LM head (``logits_to_keep`` as indices), so
    the logits are exactly ``[b, T_eff, V]``, not a slice of a larger tensor whose backward would
    allocate the larger gradient."""
    ids, attn, pos, t_eff, _ = trim(mb)
    L = ids.shape[1]
    if keep_arg:
        keep = torch.arange(L - t_eff - 1, L - 1, device=ids.device)  # [T_eff]
        logits = module(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=keep
        ).logits  # [b, T_eff, V]
    else:
        logits = module(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
        logits = logits[:, -(t_eff + 1) : -1]  # [b, T_eff, V]
    return logits, mb["responses"][:, :t_eff]


def fusable_lm_head(module: nn.Module) -> nn.Linear | None:
    """The causal LM's head when its logits are exactly ``hidden @ head.weight.T`` (a bias-free
    ``nn.Linear`` of a :data:`FUSED_LM_HEAD_MODEL_TYPES` model), else None (use the logits)."""
    config: Any = getattr(module, "config", None)  # an HF PreTrainedModel has one; other modules: None
    if config is None or config.model_type not in FUSED_LM_HEAD_MODEL_TYPES:
        return None
    get_head: Any = getattr(module, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return head if type(head) is nn.Linear and head.bias is None else None


def response_hidden(module: nn.Module, mb: Batch, *, packed: bool) -> tuple[Tensor, Tensor, Packed | None]:
    """The decoder's last hidden states at the positions that predict the response tokens, and
    those tokens: ``[b, T_eff, H]``, ``[b, T_eff]`` over the :func:`trim` columns, or (``packed``)
    ``[1, n, H]``, ``[1, n]`` and the :class:`~rlzoo.train_kit.Packed` layout."""
    decoder: Any = module.get_decoder()  # type: ignore[operator]
    if packed:
        pk = pack(mb)
        out = decoder(input_ids=pk.input_ids, position_ids=pk.position_ids, use_cache=False)
        return out.last_hidden_state[:, pk.predict_at], pk.targets[None], pk
    ids, attn, pos, t_eff, _ = trim(mb)
    L = ids.shape[1]
    out = decoder(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False)
    return out.last_hidden_state[:, L - t_eff - 1 : L - 1], mb["responses"][:, :t_eff], None


def packed_response_logits(module: nn.Module, mb: Batch, *, keep_arg: bool) -> tuple[Tensor, Packed]:
    """Logits ``[1, n, V]`` that predict the ``n`` real response tokens of a text micro-batch, from
    one padding-free forward (:func:`rlzoo.train_kit.pack`: real tokens end to end, positions
    restarting per sequence, no attention mask, so HF attention keeps each sequence to itself)."""
    pk = pack(mb)
    if keep_arg:
        out = module(
            input_ids=pk.input_ids,
            position_ids=pk.position_ids,
            use_cache=False,
            logits_to_keep=pk.predict_at,
        )
        return out.logits, pk  # [1, n, V]
    out = module(input_ids=pk.input_ids, position_ids=pk.position_ids, use_cache=False)
    return out.logits[:, pk.predict_at], pk  # [1, n, V]


def actor_log_probs_and_sum_pi_squared(
    module: nn.Module,
    mb: Batch,
    *,
    keep_arg: bool,
    temperature: float,
    vision: bool = False,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
    packed: bool = False,
) -> tuple[Tensor, Tensor]:
    """Log-probs (as :func:`actor_log_probs`) and ``common.sum_pi_squared`` ``[b, T]`` of one text
    micro-batch on the device, from one forward; zero on padding. ``vision``: refused (VL models
    take their logits inside :func:`~rlzoo.backends.native.multimodal.vl_token_log_probs`)."""
    if vision:
        raise NotImplementedError(
            "sum_pi_squared (advantages with needs_sum_pi_squared, e.g. optimal_token_baseline) is not "
            "computed for vision-language models yet; use another advantage (e.g. grpo) with VL models"
        )
    if packed:
        plogits, pk = packed_response_logits(module, mb, keep_arg=keep_arg)  # [1, n, V]
        plp, _ = token_log_probs(
            plogits, pk.targets[None], temperature=temperature, chunk_tokens=chunk_tokens
        )
        psps = common.sum_pi_squared(plogits, temperature=temperature, chunk_tokens=max(1, chunk_tokens))
        return unpack(plp[0], pk.response_valid), unpack(psps[0], pk.response_valid)  # [b, T]
    logits, targets = response_logits(module, mb, keep_arg=keep_arg)  # [b, T_eff, V], [b, T_eff]
    lp, _ = token_log_probs(logits, targets, temperature=temperature, chunk_tokens=chunk_tokens)
    sps = common.sum_pi_squared(
        logits, temperature=temperature, chunk_tokens=max(1, chunk_tokens)
    )  # [b, T_eff]
    return pad_response(lp, mb), pad_response(sps, mb)  # [b, T]


def critic_values(critic: nn.Module, mb: Batch, *, packed: bool = False) -> Tensor:
    """Values ``[b, T]`` of one micro-batch on the device (value at ``P - 1 + t``); zero on padding.
    ``packed``: one padding-free forward (as :func:`packed_response_logits`)."""
    if packed:
        pk = pack(mb)
        values = critic(pk.input_ids, None, pk.position_ids, keep_index=pk.predict_at)[0]  # [n]
        return unpack(values, pk.response_valid)  # [b, T]
    ids, attn, pos, t_eff, _ = trim(mb)
    values = critic(ids, attn, pos, keep_last=t_eff + 1)[:, :-1]  # [b, T_eff]
    return pad_response(values, mb)  # [b, T]


class CriticModel(nn.Module):
    """A transformer backbone (HF base model) + ``Linear(hidden, 1)`` value head."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        dtype = next(backbone.parameters()).dtype
        self.value_head = nn.Linear(hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.value_head.weight)  # values start at 0: deterministic, seed-free
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        position_ids: Tensor,
        keep_last: int | None = None,
        keep_index: Tensor | None = None,
    ) -> Tensor:
        """Values (fp32) at the last ``keep_last`` positions ``[b, keep_last]``, or at the
        positions ``keep_index`` ``[b, len(keep_index)]`` (a packed row: ``attention_mask`` None).

        The result is a fresh tensor, not a view: FSDP2 hooks the root module's output for its
        pre-backward all-gather (so every forward must also enter through ``__call__``).
        """
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden = out.last_hidden_state  # [b, L, H]
        hidden = hidden[:, keep_index] if keep_index is not None else hidden[:, -int(keep_last or 1) :]
        return self.value_head(hidden).float().squeeze(-1).clone()  # [b, keep]


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
        the actor (``model`` too, when given) in place (:func:`rlzoo.lora.apply_lora`).
        """
        self.params = params
        self.spec = spec
        self.temperature = common.resolve_temperature(params, spec)
        self.version = 0
        self.critic_steps = 0
        self.device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if params.device == "auto" else params.device
        )
        self.dtype = _DTYPES[params.dtype]
        self._tokenizer = tokenizer

        given_model = model is not None
        if model is None:
            model = common.load_causal_lm(spec.model_path, self._hf_kwargs())
        self.actor: Any = model.to(device=self.device, dtype=self.dtype)  # an HF PreTrainedModel
        from rlzoo.backends.native.multimodal import is_multimodal_model

        # a vision-language model (Qwen2.5-VL style): images and M-RoPE positions in every forward
        self._vl = is_multimodal_model(self.actor)
        if self._vl and params.use_remove_padding:
            logger.info(
                "use_remove_padding: %s is a vision-language model; its forwards stay padded",
                type(model).__name__,
            )
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
        self.critic: CriticModel | None = None
        if spec.need_critic:
            backbone: Any = common.critic_backbone(
                spec, critic_backbone, self.actor, given_model=given_model, kwargs=self._hf_kwargs()
            )
            hidden = int(backbone.config.hidden_size)
            self.critic = CriticModel(backbone.to(self.dtype), hidden).to(self.device)
        # LoRA: adapters injected into the actor in place (after the critic copied a clean base)
        self._lora: Any = None
        if spec.lora is not None:
            self._lora = lora.apply_lora(self.actor, spec.lora, seed=spec.seed)
            self.actor.to(device=self.device, dtype=self.dtype)
            if spec.need_reference:
                self.ref = lora.AdaptersOff(self._lora)

        if params.gradient_checkpointing:
            m: Any
            for m in (self.actor, self.critic.backbone if self.critic is not None else None):
                if m is None:
                    continue
                if hasattr(m, "activation_checkpointing_enable"):  # transformers >= 5
                    m.activation_checkpointing_enable({"use_reentrant": False})
                else:
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._keep_arg = "logits_to_keep" in inspect.signature(self.actor.forward).parameters
        # the LM head applied per chunk inside the log-softmax (the ref model has the same architecture)
        self._fuse = params.fused_lm_head and not self._vl and fusable_lm_head(self.actor) is not None
        if params.fused_lm_head and not self._vl and not self._fuse:
            logger.info(
                "fused_lm_head: %s is not one of %s; log-probs come from its logits",
                type(self.actor).__name__,
                sorted(FUSED_LM_HEAD_MODEL_TYPES),
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
        self.warmup_steps = common.warmup_steps(spec)

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
        return common.hf_kwargs(self.params, self.spec, self.dtype)

    # -- learning rates -------------------------------------------------------------------------
    def lr_at(self, step: int, *, critic: bool = False) -> float:
        """The LR of optimizer step ``step`` (0-based) of the actor or the critic."""
        return common.scheduled_lr(self.spec, self.warmup_steps, step, critic=critic)

    # -- forward passes -------------------------------------------------------------------------
    def _actor_forward(
        self, module: nn.Module, mb: Batch, *, with_entropy: bool, temperature: float
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (+ entropy) ``[b, T]`` of one micro-batch already on the device."""
        with self._autocast():
            return actor_log_probs(
                module,
                mb,
                keep_arg=self._keep_arg,
                temperature=temperature,
                with_entropy=with_entropy,
                vision_dtype=self.dtype if self._vl else None,
                chunk_tokens=self.spec.micro_batch.log_prob_chunk,
                packed=self.params.use_remove_padding,
                lm_head=fusable_lm_head(module) if self._fuse else None,  # actor's or ref's
                matmul_dtype=torch.bfloat16 if self.params.autocast is not None else None,
            )

    def _critic_forward(self, mb: Batch) -> Tensor:
        assert self.critic is not None
        with self._autocast():
            return critic_values(self.critic, mb, packed=self.params.use_remove_padding).float()

    def _autocast(self) -> Any:
        """``torch.autocast`` in bf16 when ``params.autocast`` asks for it (log-softmax stays fp32)."""
        enabled = self.params.autocast is not None
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

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

        fp32, on the input batch's device, zero where the response is padding. ``model``: "actor" or
        "ref"; ``temperature`` defaults to ``params.temperature``.
        """
        module = common.select_model(model, self.actor, self.ref)
        temp = self.temperature if temperature is None else temperature
        was_training = module.training
        module.eval()
        lps, ents = [], []
        for mb in batch.split(self.spec.micro_batch.log_prob_size):
            lp, ent = self._actor_forward(
                module, mb.to(self.device), with_entropy=with_entropy, temperature=temp
            )
            lps.append(lp)
            ents.append(ent)
        module.train(was_training)
        out_device = batch["input_ids"].device
        entropy = torch.cat(ents).to(out_device) if with_entropy else None  # type: ignore[arg-type]
        return torch.cat(lps).to(out_device), entropy

    @torch.no_grad()
    def compute_log_probs_and_sum_pi_squared(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The actor's log-probs ``[B, T]`` (as :meth:`compute_log_probs`) and ``sum_v pi_v^2``
        ``[B, T]`` of the same distribution, from one forward per micro-batch
        (:class:`rlzoo.protocols.SumPiSquaredSource`); fp32, zero on response padding."""
        module = self.actor
        was_training = module.training
        module.eval()
        lps, spss = [], []
        for mb in batch.split(self.spec.micro_batch.log_prob_size):
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
        was_training = self.critic.training
        self.critic.eval()
        out = [
            self._critic_forward(mb.to(self.device))
            for mb in batch.split(self.spec.micro_batch.log_prob_size)
        ]
        self.critic.train(was_training)
        return torch.cat(out).to(batch["input_ids"].device)

    # -- updates --------------------------------------------------------------------------------
    def micro_batches(self, mini_batch: Batch) -> list[Batch]:
        """The update's micro-batches: ``micro_batch_size`` rows, or packed by real-token count."""
        limit = self.spec.micro_batch.max_tokens
        if limit is None:
            return mini_batch.split(self.spec.micro_batch.size)
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
        """One actor optimizer step over ``mini_batch``. Metrics: the objective's (mean over
        micro-batches) + ``actor/loss`` (sum), ``actor/grad_norm``, ``actor/lr``,
        ``actor/skipped_steps``, ``actor/num_micro_batches``."""
        return common.policy_update(self, mini_batch, objective)

    def update_critic(self, mini_batch: Batch, objective: Objective) -> dict[str, float]:
        """One critic optimizer step: ``loss, metrics = objective(micro_batch, values, None)``."""
        return common.critic_update(self, mini_batch, objective)

    def _update(
        self,
        mini_batch: Batch,
        objective: Objective,
        forward: Any,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr: float,
        grad_clip: float,
        prefix: str,
    ) -> dict[str, float]:
        module.train()
        optimizer.zero_grad(set_to_none=True)
        collected: dict[str, list[Any]] = {}
        total_loss = torch.zeros((), device=self.device)
        mbs = self.micro_batches(mini_batch)
        for mb in mbs:
            mb = mb.to(self.device)
            out, entropy = forward(mb)
            loss, mb_metrics = objective(mb, out, entropy)
            loss.backward()  # no 1/num_micro_batches: the objective uses global normalisers
            total_loss += loss.detach().float()
            for k, v in mb_metrics.items():
                collected.setdefault(k, []).append(v.detach().float() if isinstance(v, Tensor) else v)

        loss_value, norm_value, skipped = common.optimizer_step(
            module, optimizer, loss=total_loss, grad_clip=grad_clip, lr=lr, device=self.device
        )
        if skipped:
            logger.warning(
                "%s update skipped: non-finite %s (loss=%s, grad_norm=%s); gradients dropped",
                prefix,
                "loss" if not math.isfinite(loss_value) else "grad norm",
                loss_value,
                norm_value,
            )
        metrics = {k: _mean(v) for k, v in collected.items()}
        metrics.update(
            common.step_metrics(
                prefix,
                loss=loss_value,
                grad_norm=norm_value,
                lr=lr,
                skipped=skipped,
                num_micro_batches=len(mbs),
            )
        )
        return metrics

    # -- weights --------------------------------------------------------------------------------
    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """``(name, tensor)`` of the actor's HF state dict, detached, on the backend's device; with
        LoRA only the adapter tensors (:func:`rlzoo.lora.adapter_items`).

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
                common.save_lora_export(
                    self.actor.state_dict(), type(self.actor), self.actor.config, self.spec, tmp
                )
            common.save_tokenizer(self._tokenizer, self.spec, tmp)

    def _actor_state(self) -> dict[str, Tensor]:
        """What a checkpoint holds of the actor: every tensor, or with LoRA the adapter only."""
        state = self.actor.state_dict()
        return state if self._lora is None else dict(lora.adapter_items(state))

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, path: Path, extra_state: Mapping[str, Any]) -> None:
        """Write a complete checkpoint to ``path`` atomically (see :meth:`load_checkpoint`)."""
        meta = common.checkpoint_meta(
            self, CHECKPOINT_FORMAT, extra_state, lora=lora.settings_record(self.spec.lora)
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
        :class:`~rlzoo.backends.native.checkpoint.IncompleteCheckpointError` when ``path`` has
        no ``COMPLETE`` marker. The reference model is not in the checkpoint: it is the initial
        weights this backend was built from. With LoRA the checkpoint holds the adapter and its
        optimizer state only: the base weights come from ``model_path`` again.
        """
        path = Path(path)
        meta = common.read_checkpoint_meta(
            path, CHECKPOINT_FORMAT, "a native train", has_critic=self.critic is not None
        )
        common.check_checkpoint_lora(path, meta, self.spec.lora)
        parts: list[tuple[str, nn.Module, torch.optim.Optimizer]] = [("actor", self.actor, self.optimizer)]
        if self.critic is not None and self.critic_optimizer is not None:
            parts.append(("critic", self.critic, self.critic_optimizer))
        for name, module, opt in parts:
            state = ckpt.load_state_dict(path / name / "model.safetensors", device=self.device)
            if module is self.actor and self._lora is not None:
                common.load_adapter_state(module, state)
            else:
                module.load_state_dict(state, strict=True)
            opt.load_state_dict(ckpt.load_tree(path / name, "optimizer"))
        self.version = int(meta["version"])
        self.critic_steps = int(meta["scheduler"]["critic"]["steps"])
        ckpt.set_rng_state(ckpt.load_tree(path, "rng"))
        return dict(meta["extra_state"])

    def shutdown(self) -> None:
        """Drop the models and optimizer states (frees device memory)."""
        for attr in ("actor", "ref", "critic", "optimizer", "critic_optimizer", "_lora"):
            setattr(self, attr, None)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _mean(values: list[Any]) -> float:
    return float(sum(float(v) for v in values) / max(1, len(values)))
