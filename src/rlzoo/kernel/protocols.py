"""The contracts of each kind: input / output containers and Protocols.

Importing this module does not import torch; tensors are only named in annotations. Shapes are
given in comments: ``B`` responses, ``T`` response tokens (padded), ``G`` groups.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from rlzoo.kernel.batch import Batch
    from rlzoo.kernel.settings import StepPlan
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
    #: [B, T] a teacher's log-probs of the sampled tokens (needs_teacher), 0 where the mask is 0
    teacher_log_probs: Tensor | None = None


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
    #: [B, T] the loss's divergence (TeacherDivergenceLoss) between the student's and the teacher's
    #: next-token distributions at each response token, with the student's gradient
    #: (losses with needs_teacher_distribution)
    teacher_divergence: Tensor | None = None


@runtime_checkable
class TeacherDivergenceLoss(Protocol):
    """A policy loss with ``needs_teacher_distribution``: besides the call, the per-position
    ``divergence(student_logits [..., V], teacher_logits [..., V], params) -> [...]`` the train
    backend applies to the two models' logits, chunk by chunk, in the update's forward (its result
    reaches the call as ``inputs.teacher_divergence``)."""

    def __call__(self, inputs: PolicyLossInputs, params: Any) -> PolicyLossOutput: ...

    def divergence(self, student_logits: Tensor, teacher_logits: Tensor, params: Any) -> Tensor: ...


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
    #: why the call could not be read (bad JSON, no name, an unclosed tag); None: a well-formed call.
    #: A malformed call is not made: the model reads this as an error observation
    malformed: str | None = None


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


@runtime_checkable
class Demonstrates(Protocol):
    """An environment that can solve a dataset row: its demonstration for supervised fine-tuning.

    ``solve(row)`` gets the row ``reset`` gets and returns the whole conversation of a correct
    episode: ``reset``'s messages, then the assistant turns (tool calls written as the recipe's
    ``rollout.multi_turn.tool_call_format`` parses them) with the tool results or replies between
    them. ``runner: sft`` with ``generate: N`` writes N of them as a demonstrations file
    (docs/distillation.md, "SFT and stages").
    """

    def solve(self, row: Mapping[str, Any]) -> list[Message]: ...


class ToolFactory(Protocol):
    def __call__(self, params: Any) -> Tool: ...


class EnvironmentFactory(Protocol):
    def __call__(self, params: Any) -> Environment: ...


@dataclass(frozen=True)
class ClientConfig:
    """Where an agent's OpenAI client points for one episode (the run's gateway)."""

    base_url: str  # http://127.0.0.1:PORT/e/EPISODE/v1 (the episode is in the path)
    api_key: str  # the run's random key; a request without it gets 401
    model: str  # the model name the gateway serves

    def env(self) -> dict[str, str]:
        """The variables the OpenAI SDKs read (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), and the model."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model}


@dataclass
class AgentResult:
    """What an agent's episode returns. With ``reward`` None the recipe's scorer judges
    ``final_answer`` (else the text of the last call's reply)."""

    reward: float | None = None
    final_answer: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # numbers become agent/env/<key> metrics


@runtime_checkable
class Agent(Protocol):
    """A user's agent: ``run(client, row)`` plays one episode (the factory is called once per episode)
    through the OpenAI-compatible gateway at ``client``; ``row`` is the dataset row (JSON values).
    May be ``async``."""

    def run(self, client: ClientConfig, row: Mapping[str, Any]) -> AgentResult | Awaitable[AgentResult]: ...


class AgentFactory(Protocol):
    def __call__(self, params: Any) -> Agent: ...


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
    #: a MoE model's routing at sampling time (router replay): the top-k expert indices of every MoE
    #: layer at each position the rollout fed to the model, ``[P + R - 1, layers, top_k]`` int (the
    #: prompt and all but the last response token); None when the rollout did not record them.
    routed_experts: Tensor | None = None

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


@runtime_checkable
class RolloutBackend(Protocol):
    @property
    def version(self) -> int:
        """The backend's weight version (stamped on every token it produces); read-only to callers."""
        ...

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
class DistillingObjective(Protocol):
    """An objective that may want the teacher's whole distribution: ``teacher_divergence`` None, or
    ``divergence(student_logits, teacher_logits) -> [...]`` (:class:`TeacherDivergenceLoss`'s, bound to
    its params); a backend
    with ``supplies_teacher_divergence`` then puts ``micro_batch["teacher_divergence"]`` ``[b, T]``
    (with the student's gradient) in each micro-batch before calling the objective. An objective
    that is not one wants none."""

    teacher_divergence: Callable[[Tensor, Tensor], Tensor] | None


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
class PromptLogProbSource(Protocol):
    """What a rollout backend that declares ``supplies_prompt_log_probs`` implements (the teacher
    on a rollout engine, ``algorithm.teacher.backend: rollout``).

    ``prompt_log_probs(sequences, starts)``: for each token id list ``sequences[i]``, the natural
    log-prob (of the raw logits: temperature 1) of every token from ``starts[i]`` on given the tokens
    before it, ``len(sequences[i]) - starts[i]`` floats (``starts[i] >= 1``). Forward-only; the
    engine's weights are never pushed to.
    """

    def prompt_log_probs(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> list[list[float]]: ...


@runtime_checkable
class RunReadyParams(Protocol):
    """Params whose defaults are a placeholder a run must complete (dapo's ``max_response_length``).

    The defaults instantiate (so the part can be selected by name and listed), but a run needs more:
    ``run_problems()`` says what is missing or inconsistent, one sentence each (no key).
    ``rlzoo validate`` reports them under the part's key (:mod:`rlzoo.recipe.checks`), before anything
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
    config key first; :mod:`rlzoo.recipe.checks` reports them at ``rlzoo validate`` / load time, before
    anything is written or loaded."""

    def check(self, cfg: Any) -> list[str]: ...
