"""Built-in reward managers: decoded samples -> rewards, by calling the selected scorer.

Import-light: params dataclasses and registration only; the managers live in
:mod:`rlzoo.algorithms.functional.reward`.

Each is a factory ``factory(params, scorer) -> manager``; ``scorer`` is
``scorer(response, ground_truth, data_source, extra_info) -> float | dict`` with its params
already bound (use :class:`rlzoo.algorithms.functional.reward.BoundScorer` to bind one so that it
also pickles, which ``process_pool`` needs). ``manager(items)`` returns one
:class:`rlzoo.kernel.protocols.RewardResult` per :class:`rlzoo.kernel.protocols.RewardItem`; a scorer that
raises, times out or returns NaN / inf / a non-number gives a failed result, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.algorithms.functional.reward"


@dataclass(frozen=True)
class NaiveParams:
    """Call the scorer once per sample; reward = score.

    A dict result's ``score`` is the reward and its other keys go to ``info``. A scorer that
    raises or returns NaN / inf / a non-number marks that sample failed with ``failure_reward``
    and the error in ``info["error"]``; the rest of the batch is scored.
    """

    failure_reward: float = param(0.0, help="reward of a sample whose scorer failed")
    timeout: float | None = param(
        60.0,
        gt=0,
        help="seconds one sample's scorer may take (run in a helper thread, abandoned when late; "
        "> 0); null: no limit, called in the caller's thread",
    )
    threads: int = param(
        8,
        ge=1,
        help="helper threads taking samples off the batch, each sample with its own timeout clock, "
        "so late samples overlap (8 hanging samples cost one timeout, not 8); 1: one after another",
    )


@dataclass(frozen=True)
class DAPOParams:
    """Naive scoring plus DAPO's overlong buffer: a linear penalty near the length limit.

    With ``L = overlong_buffer_len``, ``p = penalty_factor``, ``M = max_response_length`` a
    response of ``len`` tokens gets ``min(-(len - (M - L)) / L * p, 0)``: 0 up to ``M - L``
    tokens, falling linearly to ``-p`` at ``M``. Added to the score, as verl's
    DAPORewardManager does; ``info`` carries ``overlong_penalty`` (also as verl's
    ``overlong_reward``) and ``overlong`` (penalty < 0). Failed samples keep ``failure_reward``.
    """

    enable: bool = param(True, help="apply the overlong penalty (False: plain naive scoring)")
    overlong_buffer_len: int = param(
        4096, help="L: tokens before max_response_length where the penalty starts"
    )
    penalty_factor: float = param(1.0, help="p: penalty at max_response_length")
    max_response_length: int = param(0, help="M: the rollout's max response tokens (required when enabled)")
    failure_reward: float = param(0.0, help="reward of a sample whose scorer failed")
    timeout: float | None = param(
        60.0, gt=0, help="seconds one sample's scorer may take (as naive's, > 0); null: no limit"
    )
    threads: int = param(8, ge=1, help="helper threads scoring at once (as naive's)")

    def run_problems(self) -> list[str]:
        """What a run needs besides the defaults (:class:`rlzoo.kernel.protocols.RunReadyParams`)."""
        if not self.enable:
            return []
        if self.max_response_length <= 0:
            return [
                "max_response_length must be set when the overlong buffer is enabled: the rollout's "
                "max response tokens, e.g. max_response_length: ${data.max_response_length} (or "
                "enable: false for plain naive scoring)"
            ]
        if not 0 < self.overlong_buffer_len <= self.max_response_length:
            return [
                f"overlong_buffer_len ({self.overlong_buffer_len}) must be in (0, "
                f"max_response_length={self.max_response_length}]"
            ]
        return []


@dataclass(frozen=True)
class BatchParams(NaiveParams):
    """Call a batched scorer once on the whole batch's lists.

    A scorer with the ``batched`` capability is called as ``scorer(responses, ground_truths,
    data_sources, extra_infos)`` and returns one float / dict per sample. If that call raises,
    each sample is retried alone (as a list of one) so only the bad ones fail. A scorer without
    the capability is called per sample, exactly like ``naive``.
    """

    # naive's fields (its manager is naive's, batched); these two say what they mean here
    timeout: float | None = param(
        60.0,
        gt=0,
        help="seconds per sample (> 0): the batched call may take timeout x batch size (a late call fails "
        "every sample, without per-sample retries); null: no limit",
    )
    threads: int = param(8, ge=1, help="helper threads for per-sample calls (as naive's)")


@dataclass(frozen=True)
class ProcessPoolParams:
    """Score in worker processes, each sample within ``timeout`` seconds of reaching its worker.

    ``num_workers`` spawned processes score one sample each at a time. A late sample fails alone:
    its worker is killed and replaced while the others go on, so a scorer hanging on 2 % of the
    calls fails those 2 %. A worker that dies is named in the sample's error (pid, exit code or
    signal); its sample is retried once on a fresh worker and fails if it kills that one too. The
    scorer must pickle: bind it with ``BoundScorer`` (a lazy ``"module:attr"`` target + params)
    or pass a module-level function.
    """

    num_workers: int = param(4, ge=0, help="worker processes (0: os.cpu_count())")
    timeout: float = param(
        10.0,
        gt=0,
        help="seconds one sample may take once a worker has it (> 0); a late one fails and its "
        "worker is replaced",
    )
    failure_reward: float = param(0.0, help="reward of a sample whose scorer failed or timed out")


@hookimpl
def rlzoo_register_reward_managers(registry: Registrar[PartFactory]) -> None:
    registry.register("naive", f"{_IMPL}:NaiveRewardManager", params=NaiveParams)
    registry.register("dapo", f"{_IMPL}:DAPORewardManager", params=DAPOParams)
    registry.register(
        "batch", f"{_IMPL}:BatchRewardManager", params=BatchParams, capabilities={"batched": True}
    )
    registry.register("process_pool", f"{_IMPL}:ProcessPoolRewardManager", params=ProcessPoolParams)
