"""The contracts of each kind: input / output containers and Protocols.

Importing this module does not import torch; tensors are only named in annotations. Shapes are
given in comments: ``B`` responses, ``T`` response tokens (padded), ``G`` groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

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
    token_level_rewards: Tensor  # [B, T] float; outcome rewards sit on the last response token
    response_mask: Tensor  # [B, T] {0,1}
    group_ids: Tensor | None = None  # [B] long, responses to the same prompt share an id
    values: Tensor | None = None  # [B, T] critic values (needs_critic)
    baseline_rewards: Tensor | None = None  # [B] reward of the greedy response (needs_greedy_baseline)


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


# ---------------------------------------------------------------------------------------------
# sample filter
# ---------------------------------------------------------------------------------------------
class SampleFilterFn(Protocol):
    def __call__(self, rewards: Tensor, group_ids: Tensor, params: Any) -> Tensor: ...


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


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainSpec:
    """What a train backend factory needs besides its own params."""

    model_path: str
    seed: int = 0
    need_reference: bool = False
    need_critic: bool = False
    critic_model_path: str | None = None
    total_steps: int = 1  # optimizer steps the LR schedule spans
    trust_remote_code: bool = False
    pad_token_id: int = 0
    temperature: float = 1.0  # rollout sampling temperature: log-probs are of logits / temperature


class Objective(Protocol):
    """Per micro-batch objective built by :mod:`rlzoo.objective` from the selected parts."""

    def __call__(
        self, micro_batch: Batch, log_probs: Tensor, entropy: Tensor | None
    ) -> tuple[Tensor, dict[str, Any]]: ...


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


class Runner(Protocol):
    def run(self) -> dict[str, Any]: ...
