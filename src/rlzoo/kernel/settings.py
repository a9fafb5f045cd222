"""Settings every backend and runner shares, as frozen dataclasses: what a backend factory is given
besides its own params (:class:`TrainSpec`, :class:`RolloutSpec`: the optimizer, micro-batches and
LoRA settings among them) and how a run is cut into steps (:class:`StepPlan`). The calling
conventions (Protocols) are in :mod:`rlzoo.kernel.protocols`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlzoo.kernel.params import check_ranges, param

#: Learning-rate schedules every train backend understands (``trainer.optim.lr_scheduler``).
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class OptimSettings:
    """Optimizer and LR schedule of the actor and the critic (``trainer.optim``), shared by every
    train backend: switching ``trainer.backend`` keeps them. The critic has its own LR, weight decay and
    clip; its schedule, warmup and final LR ratio are the actor's unless its ``critic_*`` ones are set.

    AdamW with decoupled weight decay; the schedule counts **optimizer steps** (``TrainSpec.total_steps``
    = trainer steps x mini-batches per step x PPO epochs), as HF's / verl's schedulers do.
    """

    lr: float = param(1e-6, gt=0, help="AdamW peak learning rate of the actor (> 0)")
    betas: tuple[float, float] = param((0.9, 0.999), help="AdamW betas (each in [0, 1))")
    eps: float = param(1e-8, gt=0, help="AdamW epsilon (> 0)")
    weight_decay: float = param(0.01, ge=0, help="AdamW decoupled weight decay of the actor (>= 0)")
    grad_clip: float = param(
        1.0, help="max global grad norm of the actor; <= 0 disables clipping (the norm is still logged)"
    )
    lr_scheduler: str = param(
        "constant", help="'constant', 'linear' (to min_lr_ratio) or 'cosine' (to min_lr_ratio)"
    )
    warmup_steps: int = param(0, ge=0, help="linear warmup, in optimizer steps; 0: use warmup_ratio")
    warmup_ratio: float = param(
        0.0,
        ge=0,
        lt=1,
        help="warmup as a fraction of the run's optimizer steps (when warmup_steps is 0), in [0, 1)",
    )
    min_lr_ratio: float = param(
        0.0, ge=0, le=1, help="final LR of linear / cosine decay, as a fraction of the peak LR"
    )
    critic_lr: float = param(1e-5, gt=0, help="AdamW peak learning rate of the critic (> 0)")
    critic_weight_decay: float = param(0.01, ge=0, help="AdamW weight decay of the critic (>= 0)")
    critic_grad_clip: float = param(1.0, help="max grad norm of the critic; <= 0 disables clipping")
    critic_lr_scheduler: str | None = param(
        None, help="the critic's own schedule ('constant', 'linear', 'cosine'); null: lr_scheduler's"
    )
    critic_warmup_steps: int | None = param(
        None, ge=0, help="the critic's own linear warmup, in its optimizer steps; null: the actor's warmup"
    )
    critic_warmup_ratio: float | None = param(
        None,
        ge=0,
        lt=1,
        help="the critic's warmup as a fraction of the run's optimizer steps, in [0, 1); null: the actor's",
    )
    critic_min_lr_ratio: float | None = param(
        None,
        ge=0,
        le=1,
        help="final LR of the critic's linear / cosine decay, of critic_lr; null: min_lr_ratio's",
    )

    def __post_init__(self) -> None:
        problems = check_ranges(self)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            problems.append(f"betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.lr_scheduler not in LR_SCHEDULES:
            problems.append(
                f"lr_scheduler must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_scheduler!r}"
            )
        if self.critic_lr_scheduler is not None and self.critic_lr_scheduler not in LR_SCHEDULES:
            problems.append(
                f"critic_lr_scheduler must be one of {', '.join(LR_SCHEDULES)} (or null: the actor's), "
                f"got {self.critic_lr_scheduler!r}"
            )
        if self.warmup_steps and self.warmup_ratio:  # both in range, so both positive
            problems.append("set warmup_steps or warmup_ratio, not both")
        if self.critic_warmup_steps and self.critic_warmup_ratio:
            problems.append("set critic_warmup_steps or critic_warmup_ratio, not both")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class MicroBatchSettings:
    """How a train backend splits work into forwards (``trainer.micro_batch``), per device / rank."""

    size: int | None = param(
        None,
        ge=1,
        help="samples per forward/backward in updates (>= 1); null: the largest that fits the machine's "
        "memory, chosen and printed when the run starts (docs/performance.md), 4 where it cannot tell",
    )
    max_tokens: int | None = param(
        None,
        ge=1,
        help="if set, updates pack consecutive samples into micro-batches of at most this many real "
        "tokens (prompt + response; a longer sample goes alone) instead of `size`",
    )
    log_prob_size: int | None = param(
        None,
        ge=1,
        help="samples per forward in log-prob / value computations (>= 1); null: chosen with size "
        "(twice it), 8 where it cannot tell",
    )
    log_prob_chunk: int = param(
        256,
        ge=0,
        help="positions per chunk of the log-prob / entropy computation from the logits, forward and "
        "backward (no fp32 [rows, T, vocab] copy is built whole; see docs/performance.md); 0: unchunked",
    )

    #: the sizes used when a size is null and nothing chose one (no memory / model information)
    FALLBACK_SIZE: ClassVar[int] = 4
    FALLBACK_LOG_PROB_SIZE: ClassVar[int] = 8

    def __post_init__(self) -> None:
        problems = check_ranges(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def update_rows(self) -> int:
        """Samples per forward/backward of an update: ``size``, or the fallback when unset."""
        return self.size if self.size is not None else self.FALLBACK_SIZE

    @property
    def log_prob_rows(self) -> int:
        """Samples per log-prob / value forward: ``log_prob_size``, or the fallback when unset."""
        return self.log_prob_size if self.log_prob_size is not None else self.FALLBACK_LOG_PROB_SIZE


#: ``target_modules`` entry that selects every linear layer except the LM head (peft's meaning).
LORA_ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters on the actor (``trainer.lora``; absent: full fine-tuning), through ``peft``.

    Each targeted linear layer ``W`` becomes ``W x + (alpha / rank) B A x`` with ``A`` ``[rank, in]``
    (Kaiming-uniform init) and ``B`` ``[out, rank]`` (zero init, so training starts from the base
    model). Only ``A`` and ``B`` are trained, pushed to the rollout backend and checkpointed; the
    reference policy is the same model with its adapters disabled. See docs/lora.md.
    """

    rank: int = param(16, ge=1, help="LoRA rank r (>= 1)")
    alpha: float = param(32.0, gt=0, help="LoRA alpha; the update is scaled by alpha / rank (> 0)")
    dropout: float = param(0.0, ge=0, lt=1, help="dropout on the adapter's input in training (in [0, 1))")
    target_modules: tuple[str, ...] = param(
        (LORA_ALL_LINEAR,),
        help="names of the linear modules that get adapters, matched as peft does (a module whose name "
        "is, or ends with '.' + , an entry, e.g. q_proj); 'all-linear': every linear layer but the LM head. "
        "Names the model lacks are refused when the model is built, listing the ones it has",
    )
    exclude_modules: str | None = param(
        None,
        help="a regular expression: linear modules whose full name matches it whole get no adapter, "
        "even when target_modules selects them (peft's exclude_modules), e.g. '.*visual.*'",
    )
    adapter_path: str | None = param(
        None,
        help="continue from an existing PEFT adapter folder (adapter_config.json + "
        "adapter_model.safetensors) instead of fresh adapters; its r, lora_alpha and target_modules must "
        "equal rank, alpha and target_modules (verl's lora_adapter_path; docs/lora.md)",
    )

    def __post_init__(self) -> None:
        problems = check_ranges(self)
        if self.exclude_modules is not None:
            import re

            try:
                re.compile(self.exclude_modules)
            except re.error as e:
                problems.append(f"exclude_modules {self.exclude_modules!r} is not a regular expression ({e})")
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            problems.append(
                f"target_modules must be a non-empty list of module names, got {list(self.target_modules)}"
            )
        elif LORA_ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            problems.append(f"target_modules: {LORA_ALL_LINEAR!r} selects every linear layer; give it alone")
        if self.adapter_path is not None and not problems:
            problems += adapter_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    def width_problem(self, width: int, model: str) -> str | None:
        """Why :attr:`rank` cannot work on a model whose hidden size is ``width`` (None: it can).

        A LoRA update ``B A`` of rank r on a layer ``[out, in]`` has rank at most ``min(out, in,
        r)``: a rank above the model's width adds only parameters that can never matter."""
        if self.rank <= width:
            return None
        return (
            f"trainer.lora.rank: {self.rank} is more than the width of {model} (hidden size {width}); "
            f"a LoRA rank is at most the layer width (typically 8-64): set trainer.lora.rank <= {width}"
        )

    @property
    def scaling(self) -> float:
        """``alpha / rank``: the factor on ``B A``."""
        return float(self.alpha) / int(self.rank)


def model_width(config: Mapping[str, Any]) -> int | None:
    """The hidden size an HF ``config.json`` declares (``hidden_size``, ``n_embd`` or ``d_model``; a
    vision-language model's ``text_config``), or None when it declares none."""
    for key in ("hidden_size", "n_embd", "d_model"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    text = config.get("text_config")
    return model_width(text) if isinstance(text, Mapping) else None


@dataclass(frozen=True)
class TeacherModel:
    """The teacher a train backend loads beside the actor, forward-only (from ``algorithm.teacher``,
    whose section holds the defaults and the help)."""

    path: str  # a model folder (HF, an rlzoo final/ or export/step_K) or a hub name
    dtype: str | None  # "float32" / "bfloat16" / "float16"; None: the train backend's dtype
    trust_remote_code: bool


@dataclass(frozen=True)
class TrainSpec:
    """What a train backend factory needs besides its own params: the run's models and the trainer
    settings every backend shares (``optim``, ``micro_batch``)."""

    model_path: str
    seed: int = 0
    need_reference: bool = False
    need_critic: bool = False
    critic_model_path: str | None = None
    total_steps: int = 1  # optimizer steps the LR schedule spans (see rlzoo.recipe.types.optimizer_steps)
    trust_remote_code: bool = False
    pad_token_id: int = 0
    temperature: float = 1.0  # rollout sampling temperature: log-probs are of logits / temperature
    optim: OptimSettings = field(default_factory=OptimSettings)
    micro_batch: MicroBatchSettings = field(default_factory=MicroBatchSettings)
    lora: LoraSettings | None = None  # LoRA adapters on the actor; None: full fine-tuning
    teacher: TeacherModel | None = None  # a forward-only teacher (compute_log_probs(model="teacher"))


@dataclass(frozen=True)
class RolloutSpec:
    """What a rollout backend factory needs besides its own params."""

    model_path: str
    tokenizer_path: str
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    trust_remote_code: bool = False
    max_prompt_length: int = 512
    max_response_length: int = 128
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    lora: LoraSettings | None = None  # the trainer trains LoRA adapters: pushes carry only those


@dataclass(frozen=True)
class StepPlan:
    """How a run is cut into trainer steps: computed once from the recipe
    (:func:`rlzoo.recipe.types.step_plan`), then read by the session, the loop and the batch source."""

    #: prompts (groups of ``rollout.n`` responses) one trainer step trains on; with the training
    #: data it gives the steps per epoch, with ``trainer.ppo_mini_batch_size`` the LR schedule
    prompts_per_step: int
    #: trainer steps between two weight pushes (the loop also pushes after the last step)
    push_every: int = 1
    #: the run's trainer steps when the runner fixes them (fully-async ``total_rollout_steps``);
    #: None: ``trainer.total_steps``, else ``trainer.total_epochs`` epochs
    step_limit: int | None = None


def adapter_problems(settings: LoraSettings) -> list[str]:
    """What keeps ``settings.adapter_path`` from being continued from with these settings: the folder,
    its two files, and its ``adapter_config.json``'s ``r`` / ``lora_alpha`` / ``target_modules`` against
    ``rank`` / ``alpha`` / ``target_modules``. Reads the JSON only."""
    import json
    from pathlib import Path

    path = settings.adapter_path or ""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return [
            f"adapter_path {path!r} is not a folder; give a PEFT adapter folder (adapter_config.json + "
            "adapter_model.safetensors), e.g. a run's export/final/adapter"
        ]
    missing = [f for f in ("adapter_config.json", "adapter_model.safetensors") if not (folder / f).is_file()]
    if missing:
        return [f"adapter_path {path!r} has no {' and no '.join(missing)}; a PEFT adapter folder holds both"]
    try:
        cfg = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as e:
        return [f"adapter_path {path!r}: adapter_config.json is not readable JSON ({e})"]
    targets = cfg.get("target_modules")
    theirs = sorted([targets] if isinstance(targets, str) else targets or [])
    wanted = {
        "rank": (settings.rank, cfg.get("r")),
        "alpha": (float(settings.alpha), None if cfg.get("lora_alpha") is None else float(cfg["lora_alpha"])),
        "target_modules": (sorted(settings.target_modules), theirs),
    }
    return [
        f"{key}: {ours!r}, but the adapter at {path!r} was trained with {theirs_v!r}; set {key} to "
        f"{theirs_v!r} to continue from it"
        for key, (ours, theirs_v) in wanted.items()
        if ours != theirs_v
    ]
