"""The contracts of each kind: input / output containers and Protocols.

Importing this module does not import torch; tensors are only named in annotations. Shapes are
given in comments: ``B`` responses, ``T`` response tokens (padded), ``G`` groups.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlzoo.params import param

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from rlzoo.batch import Batch
else:  # keep annotations resolvable for get_type_hints without importing torch
    Tensor = Any


# ---------------------------------------------------------------------------------------------
# advantage
# ---------------------------------------------------------------------------------------------
@dataclass
class AdvantageInputs:
    #: [B, T] float; an outcome reward sits on the last response token, a multi-turn trajectory's
    #: per-turn rewards on the last token of the model turn each rewards
    token_level_rewards: Tensor
    response_mask: Tensor  # [B, T] {0,1}
    group_ids: Tensor | None = None  # [B] long, responses to the same prompt share an id
    values: Tensor | None = None  # [B, T] critic values (needs_critic)
    baseline_rewards: Tensor | None = None  # [B] reward of the greedy response (needs_greedy_baseline)
    old_log_probs: Tensor | None = None  # [B, T] log-probs of the sampled tokens (needs_old_log_probs)
    sum_pi_squared: Tensor | None = None  # [B, T] sum over the vocabulary of pi^2 (token baselines)
    rollout_is_weights: Tensor | None = None  # [B, T] IS weights of the rollout correction, if any
    reward_components: Tensor | None = None  # [B, K] per-component outcome rewards (gdpo)
    #: [B, T] long: the 0-based model turn of each response token, -1 off the model's turns
    #: (observations, padding); None for a batch without multi-turn trajectories
    turn_ids: Tensor | None = None


@dataclass
class AdvantageOutput:
    advantages: Tensor  # [B, T], zero where response_mask is 0
    returns: Tensor  # [B, T]


class AdvantageFn(Protocol):
    def __call__(self, inputs: AdvantageInputs, params: Any) -> AdvantageOutput: ...


# ---------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AggContext:
    """Global normalisers of one mini-batch (over all micro-batches and data-parallel ranks)."""

    global_tokens: float  # number of unmasked response tokens in the whole mini-batch
    global_sequences: float  # number of sequences with at least one unmasked token
    max_response_length: int = 1  # T used by seq-mean-token-sum-norm
    #: Denominator of token-sum style aggregations (1 means plain sum).
    loss_scale_factor: float = 1.0


class LossAggFn(Protocol):
    def __call__(self, per_token_loss: Tensor, mask: Tensor, ctx: AggContext, params: Any) -> Tensor: ...


#: An aggregation bound to its context and params: ``agg(per_token_loss, mask) -> scalar``.
BoundAgg = Callable[["Tensor", "Tensor"], "Tensor"]


# ---------------------------------------------------------------------------------------------
# policy loss
# ---------------------------------------------------------------------------------------------
@dataclass
class PolicyLossInputs:
    log_probs: Tensor  # [B, T] current policy
    old_log_probs: Tensor  # [B, T] policy that the ratios are taken against (proximal policy)
    advantages: Tensor  # [B, T]
    response_mask: Tensor  # [B, T]
    agg: BoundAgg  # the selected aggregation, bound to the global counts
    rollout_is_weights: Tensor | None = None  # [B, T] off-policy correction weights (detached)
    entropy: Tensor | None = None  # [B, T] (losses with needs_entropy)


@dataclass
class PolicyLossOutput:
    loss: Tensor  # scalar, already aggregated with inputs.agg
    metrics: dict[str, float | Tensor] = field(default_factory=dict)


class PolicyLossFn(Protocol):
    def __call__(self, inputs: PolicyLossInputs, params: Any) -> PolicyLossOutput: ...


# ---------------------------------------------------------------------------------------------
# kl
# ---------------------------------------------------------------------------------------------
class KLFn(Protocol):
    def __call__(self, log_probs: Tensor, ref_log_probs: Tensor, params: Any) -> Tensor: ...


# ---------------------------------------------------------------------------------------------
# rollout correction (off-policy)
# ---------------------------------------------------------------------------------------------
@dataclass
class CorrectionInputs:
    old_log_probs: Tensor  # [B, T] trainer's log-probs of the sampling policy's weights
    rollout_log_probs: Tensor  # [B, T] log-probs reported by the rollout engine
    response_mask: Tensor  # [B, T]


@dataclass
class CorrectionOutput:
    weights: Tensor | None  # [B, T] importance weights (detached), None for none
    mask: Tensor  # [B, T] response mask after rejection
    metrics: dict[str, float | Tensor] = field(default_factory=dict)
    #: "decoupled": PPO ratios against old_log_probs, weights multiply the loss (three policies);
    #: "bypass": old_log_probs := rollout_log_probs, no separate recomputation.
    mode: str = "decoupled"


class CorrectionFn(Protocol):
    def __call__(self, inputs: CorrectionInputs, params: Any) -> CorrectionOutput: ...


@runtime_checkable
class CorrectionMode(Protocol):
    """Params of a rollout-correction part: ``mode`` ``decoupled`` (old log-probs recomputed by
    the trainer) or ``bypass`` (the rollout log-probs serve as old log-probs). Without it: decoupled."""

    mode: str


# ---------------------------------------------------------------------------------------------
# sample filter
# ---------------------------------------------------------------------------------------------
class SampleFilterFn(Protocol):
    def __call__(self, rewards: Tensor, group_ids: Tensor, params: Any) -> Tensor: ...


@runtime_checkable
class JudgedMetric(Protocol):
    """Sample-filter params that choose the per-sample value the filter judges: ``reward`` (the
    default, also without these params), ``score``, ``acc`` or another key of the scorer's info."""

    metric: str


@runtime_checkable
class RefillLimit(Protocol):
    """Params of a sample filter with the ``refills`` capability: the most generation rounds a
    runner makes to fill one batch (0: until it is full). Without them: until it is full."""

    max_num_gen_batches: int


# ---------------------------------------------------------------------------------------------
# rewards
# ---------------------------------------------------------------------------------------------
@dataclass
class RewardItem:
    """One decoded sample, as a reward manager sees it."""

    response: str
    ground_truth: Any
    data_source: str = "default"
    prompt: str = ""
    response_length: int = 0  # tokens
    finish_reason: str = "stop"  # "stop" | "length" | "abort"
    extra_info: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class RewardResult:
    reward: float  # what training uses (score + shaping)
    score: float  # the scorer's verdict alone
    failed: bool = False  # the scorer raised, timed out or returned NaN
    info: dict[str, Any] = field(default_factory=dict)


class ScorerFn(Protocol):
    def __call__(
        self, response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Any
    ) -> float | dict[str, Any]: ...


class RewardManager(Protocol):
    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]: ...


# ---------------------------------------------------------------------------------------------
# agents: environments and tools (multi-turn rollouts)
# ---------------------------------------------------------------------------------------------
#: A chat message: ``{"role": "user" | "assistant" | "tool" | "system", "content": str, ...}``.
Message = dict[str, Any]


@dataclass
class EnvStep:
    """What an environment returns from ``reset`` (the first observation) and ``step``."""

    messages: list[Message]  # appended to the conversation (reset: the whole prompt)
    reward: float | None = None  # this turn's reward (None: none); the trajectory's is their sum
    done: bool = False  # the episode ended: no further model turn
    info: dict[str, Any] = field(default_factory=dict)  # numbers become agent/env/<key> metrics
    #: dense rewards (``step`` only): one list per turn of ``AgentTurn.turn_tokens``, one reward per
    #: token, each put on that very token; they add to the trajectory's reward (None: none)
    token_rewards: list[list[float]] | None = None


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from a model's turn."""

    name: str
    arguments: dict[str, Any]
    raw: str = ""  # the text it was parsed from


@dataclass(frozen=True)
class AgentTurn:
    """The model's turn, as an environment reads it.

    ``text`` is the sampled ids decoded for reading only: the trajectory keeps the sampled ids
    themselves, never this text encoded again.
    """

    text: str
    turn: int  # 0-based index of the model turn in the trajectory
    finish_reason: str = "stop"  # "stop" | "length"
    #: the tool calls the model made since the environment's last step (with their results)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[str, ...] = ()
    #: the model turns since the environment's last step (the tool-calling ones, then this one),
    #: each as its sampled tokens decoded one by one (the stop token included): what
    #: ``EnvStep.token_rewards`` lines up with
    turn_tokens: tuple[tuple[str, ...], ...] = ()


@runtime_checkable
class Tool(Protocol):
    """A tool a model calls: ``call(arguments)`` returns text (or awaits it) within ``timeout_s``."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments ({"type": "object", ...})
    timeout_s: float  # per call; a call past it is a tool error the model reads

    def call(self, arguments: Mapping[str, Any]) -> str | Awaitable[str]: ...


@runtime_checkable
class Environment(Protocol):
    """One episode (the factory is called once per trajectory). Methods may be ``async``."""

    def reset(self, row: Mapping[str, Any]) -> EnvStep | Awaitable[EnvStep]: ...
    def step(self, turn: AgentTurn) -> EnvStep | Awaitable[EnvStep]: ...
    def tools(self) -> Sequence[Tool]: ...


class ToolFactory(Protocol):
    def __call__(self, params: Any) -> Tool: ...


class EnvironmentFactory(Protocol):
    def __call__(self, params: Any) -> Environment: ...


# ---------------------------------------------------------------------------------------------
# rollout
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    max_new_tokens: int = 128
    greedy: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    data: dict[str, Any] = field(default_factory=dict)  # row fields carried to the samples
    multi_modal: dict[str, Any] | None = None  # e.g. {"pixel_values": ..., "image_grid_thw": ...}


@dataclass
class Sample:
    """One response to one prompt, as the rollout backend produced it."""

    request_id: str
    index: int  # 0..n-1 within the request
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_log_probs: list[float]  # one per response token
    versions: list[int]  # policy version that produced each response token
    finish_reason: str  # "stop" | "length" | "abort"
    data: dict[str, Any] = field(default_factory=dict)
    multi_modal: dict[str, Any] | None = None
    #: one per response token: 1 where the policy sampled it (trained), 0 where an environment or
    #: a tool wrote it (multi-turn; see :mod:`rlzoo.agents`). None: every token was sampled.
    loss_mask: list[int] | None = None
    #: a multi-turn trajectory's record (turns, tool calls, errors, rewards, env time; see
    #: :class:`rlzoo.agents.TrajectoryStats`); None for a single-turn sample.
    agent: dict[str, Any] | None = None

    @classmethod
    def of_request(
        cls,
        request: GenerationRequest,
        index: int,
        response_ids: list[int],
        rollout_log_probs: list[float],
        versions: list[int],
        finish_reason: str,
    ) -> Sample:
        """The ``index``-th response to ``request``, carrying its prompt, row data and images."""
        return cls(
            request_id=request.request_id,
            index=index,
            prompt_ids=list(request.prompt_ids),
            response_ids=response_ids,
            rollout_log_probs=rollout_log_probs,
            versions=versions,
            finish_reason=finish_reason,
            data=dict(request.data),
            multi_modal=request.multi_modal,
        )

    @property
    def uid(self) -> str:
        return f"{self.request_id}/{self.index}"

    @property
    def min_version(self) -> int:
        return min(self.versions) if self.versions else -1

    @property
    def max_version(self) -> int:
        return max(self.versions) if self.versions else -1


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


@runtime_checkable
class RolloutBackend(Protocol):
    version: int

    def submit(self, requests: Sequence[GenerationRequest]) -> None: ...
    def stream(self, timeout: float | None = None) -> Iterator[Sample]: ...
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Sample]: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...
    def num_pending(self) -> int: ...
    def shutdown(self) -> None: ...


@runtime_checkable
class ReportsWeightSync(Protocol):
    """A rollout side that moves pushed weights itself (the Ray rollout group, given a weight handle):
    what its last sync moved (``bytes``, ``seconds``, ``path`` ...), for the push metrics."""

    last_sync: Mapping[str, Any]


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
#: Learning-rate schedules every train backend understands (``trainer.optim.lr_scheduler``).
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class OptimSettings:
    """Optimizer and LR schedule of the actor and the critic (``trainer.optim``), shared by every
    train backend: switching ``trainer.backend`` keeps them.

    AdamW with decoupled weight decay; the schedule counts **optimizer steps** (``TrainSpec.total_steps``
    = trainer steps x mini-batches per step x PPO epochs), as HF's / verl's schedulers do.
    """

    lr: float = param(1e-6, help="AdamW peak learning rate of the actor (> 0)")
    betas: tuple[float, float] = param((0.9, 0.999), help="AdamW betas (each in [0, 1))")
    eps: float = param(1e-8, help="AdamW epsilon (> 0)")
    weight_decay: float = param(0.01, help="AdamW decoupled weight decay of the actor (>= 0)")
    grad_clip: float = param(
        1.0, help="max global grad norm of the actor; <= 0 disables clipping (the norm is still logged)"
    )
    lr_scheduler: str = param(
        "constant", help="'constant', 'linear' (to min_lr_ratio) or 'cosine' (to min_lr_ratio)"
    )
    warmup_steps: int = param(0, help="linear warmup, in optimizer steps; 0: use warmup_ratio")
    warmup_ratio: float = param(
        0.0, help="warmup as a fraction of the run's optimizer steps (when warmup_steps is 0), in [0, 1)"
    )
    min_lr_ratio: float = param(0.0, help="final LR of linear / cosine decay, as a fraction of the peak LR")
    critic_lr: float = param(1e-5, help="AdamW peak learning rate of the critic (> 0)")
    critic_weight_decay: float = param(0.01, help="AdamW weight decay of the critic (>= 0)")
    critic_grad_clip: float = param(1.0, help="max grad norm of the critic; <= 0 disables clipping")

    def __post_init__(self) -> None:
        problems = []
        for name in ("lr", "critic_lr", "eps"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "critic_weight_decay"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            problems.append(f"betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.lr_scheduler not in LR_SCHEDULES:
            problems.append(
                f"lr_scheduler must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_scheduler!r}"
            )
        if self.warmup_steps < 0 or not 0.0 <= self.warmup_ratio < 1.0:
            problems.append("warmup_steps must be >= 0 and warmup_ratio in [0, 1)")
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            problems.append("set warmup_steps or warmup_ratio, not both")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class MicroBatchSettings:
    """How a train backend splits work into forwards (``trainer.micro_batch``), per device / rank."""

    size: int = param(4, help="samples per forward/backward in updates (>= 1)")
    max_tokens: int | None = param(
        None,
        help="if set, updates pack consecutive samples into micro-batches of at most this many real "
        "tokens (prompt + response; a longer sample goes alone) instead of `size`",
    )
    log_prob_size: int = param(8, help="samples per forward in log-prob / value computations (>= 1)")
    log_prob_chunk: int = param(
        256,
        help="positions per chunk of the log-prob / entropy computation from the logits, forward and "
        "backward (no fp32 [rows, T, vocab] copy is built whole; see docs/performance.md); 0: unchunked",
    )

    def __post_init__(self) -> None:
        problems = []
        if self.size < 1 or self.log_prob_size < 1:
            problems.append(f"size and log_prob_size must be >= 1, got {self.size} and {self.log_prob_size}")
        if self.log_prob_chunk < 0:
            problems.append(f"log_prob_chunk must be >= 0 (0: unchunked), got {self.log_prob_chunk}")
        if self.max_tokens is not None and self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1 or null, got {self.max_tokens}")
        if problems:
            raise ValueError("; ".join(problems))


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
    dropout: float = param(0.0, ge=0, le=0.99, help="dropout on the adapter's input in training (in [0, 1))")
    target_modules: tuple[str, ...] = param(
        (LORA_ALL_LINEAR,),
        help="names of the linear modules that get adapters, matched as peft does (a module whose name "
        "is, or ends with '.' + , an entry, e.g. q_proj); 'all-linear': every linear layer but the LM head. "
        "Names the model lacks are refused when the model is built, listing the ones it has",
    )

    def __post_init__(self) -> None:
        problems = []
        if not self.rank >= 1:
            problems.append(f"rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            problems.append(f"alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            problems.append(
                f"target_modules must be a non-empty list of module names, got {list(self.target_modules)}"
            )
        elif LORA_ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            problems.append(f"target_modules: {LORA_ALL_LINEAR!r} selects every linear layer; give it alone")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def scaling(self) -> float:
        """``alpha / rank``: the factor on ``B A``."""
        return float(self.alpha) / int(self.rank)


@dataclass(frozen=True)
class TrainSpec:
    """What a train backend factory needs besides its own params: the run's models and the trainer
    settings every backend shares (``optim``, ``micro_batch``)."""

    model_path: str
    seed: int = 0
    need_reference: bool = False
    need_critic: bool = False
    critic_model_path: str | None = None
    total_steps: int = 1  # optimizer steps the LR schedule spans (see rlzoo.recipe.optimizer_steps)
    trust_remote_code: bool = False
    pad_token_id: int = 0
    temperature: float = 1.0  # rollout sampling temperature: log-probs are of logits / temperature
    optim: OptimSettings = field(default_factory=OptimSettings)
    micro_batch: MicroBatchSettings = field(default_factory=MicroBatchSettings)
    lora: LoraSettings | None = None  # LoRA adapters on the actor; None: full fine-tuning


class Objective(Protocol):
    """Per micro-batch objective built by :mod:`rlzoo.train.objective` from the selected parts.

    A train backend calls it on each micro-batch with the log-probs (or values) ``[b, T]`` and,
    when ``needs_entropy``, the per-token entropy ``[b, T]`` (else None), back-propagates the loss
    and reports the returned metrics (mean over micro-batches).
    """

    @property
    def needs_entropy(self) -> bool: ...

    def __call__(
        self, micro_batch: Batch, log_probs: Tensor, entropy: Tensor | None
    ) -> tuple[Tensor, dict[str, Any]]: ...


class MetricAccumulator(Protocol):
    """Metrics an objective accumulates over an update's micro-batches, read with ``summary()``.

    A data-parallel backend, whose ranks each see their shard, makes ``summary()`` read the same
    on every rank: ``mark()`` before the update; after it, ``since(mark)`` on each rank (what this
    rank added; picklable), gathered from all ranks, then ``merge(mark, gathered)``.
    """

    def summary(self) -> dict[str, float]: ...
    def mark(self) -> Any: ...
    def since(self, mark: Any) -> Any: ...
    def merge(self, mark: Any, added: Sequence[Any]) -> None: ...


@runtime_checkable
class AccumulatingObjective(Objective, Protocol):
    """An :class:`Objective` whose metrics accumulate in ``acc`` (:class:`rlzoo.train.objective.PolicyObjective`,
    ``ValueObjective``); a plain objective returns its metrics per micro-batch only."""

    @property
    def acc(self) -> MetricAccumulator: ...


@runtime_checkable
class TrainBackend(Protocol):
    version: int  # policy version: number of optimizer steps taken

    def compute_log_probs(
        self, batch: Batch, *, model: str = "actor", with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]: ...
    def compute_values(self, batch: Batch) -> Tensor: ...
    def update_policy(self, mini_batch: Batch, objective: Objective) -> dict[str, float]: ...
    def update_critic(self, mini_batch: Batch, objective: Objective) -> dict[str, float]: ...
    def export_weights(self) -> Iterable[tuple[str, torch.Tensor]]: ...
    def save_checkpoint(self, path: Path, extra_state: Mapping[str, Any]) -> None: ...
    def load_checkpoint(self, path: Path) -> dict[str, Any]: ...
    def shutdown(self) -> None: ...


@runtime_checkable
class SumPiSquaredSource(Protocol):
    """What a train backend that declares ``supplies_sum_pi_squared`` implements.

    ``compute_log_probs_and_sum_pi_squared(batch)`` returns the actor's log-probs ``[B, T]`` (as
    ``compute_log_probs(batch)`` gives them) and, from the same forward, ``sum_v pi_v^2`` ``[B, T]``
    of the same distribution (``softmax(logits / temperature)``) at each response token; fp32, no
    grad, zero on response padding. The policy trainer calls it instead of ``compute_log_probs`` for
    the old log-probs when the advantage declares ``needs_sum_pi_squared``.
    """

    def compute_log_probs_and_sum_pi_squared(self, batch: Batch) -> tuple[Tensor, Tensor]: ...


@runtime_checkable
class RunReadyParams(Protocol):
    """Params whose defaults are a placeholder a run must complete (dapo's ``max_response_length``).

    The defaults instantiate (so the part can be selected by name and listed), but a run needs more:
    ``run_problems()`` says what is missing or inconsistent, one sentence each (no key).
    ``rlzoo validate`` reports them under the part's key (:mod:`rlzoo.checks`), before anything
    is written, and the part raises them when it is built.
    """

    def run_problems(self) -> list[str]: ...


@runtime_checkable
class RewardComponentKeys(Protocol):
    """Params of an advantage that declares ``needs_reward_components``: the reward components it reads.

    The policy trainer builds ``AdvantageInputs.reward_components [B, K]`` from each sample's reward
    info (the scorer's dict, plus its ``score``) in ``reward_keys`` order; no keys: none are built.
    """

    reward_keys: Sequence[str]


# ---------------------------------------------------------------------------------------------
# runner: the step plan and what a runner's (or a rollout backend's) params may declare
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPlan:
    """How a run is cut into trainer steps: computed once from the recipe
    (:func:`rlzoo.recipe.step_plan`), then read by the session, the loop and the batch source."""

    #: prompts (groups of ``rollout.n`` responses) one trainer step trains on; with the training
    #: data it gives the steps per epoch, with ``trainer.ppo_mini_batch_size`` the LR schedule
    prompts_per_step: int
    #: trainer steps between two weight pushes (the loop also pushes after the last step)
    push_every: int = 1
    #: the run's trainer steps when the runner fixes them (fully-async ``total_rollout_steps``);
    #: None: ``trainer.total_steps``, else ``trainer.total_epochs`` epochs
    step_limit: int | None = None


@runtime_checkable
class PlansSteps(Protocol):
    """Runner params whose steps differ from the default plan (``data.train_batch_size`` prompts
    per step, a weight push every step): fully-async's ``require_batches`` mini-batches per step,
    a push every ``trigger_parameter_sync_step`` steps."""

    def step_plan(self, cfg: Any) -> StepPlan: ...


@runtime_checkable
class ChecksRecipe(Protocol):
    """Params with rules across the recipe (a runner's knobs against the data and the backends, a
    rollout backend against the placement). ``check(cfg)`` returns one sentence per problem, the
    config key first; :mod:`rlzoo.checks` reports them at ``rlzoo validate`` / load time, before
    anything is written or loaded."""

    def check(self, cfg: Any) -> list[str]: ...
