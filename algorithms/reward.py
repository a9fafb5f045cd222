"""Built-in reward managers: decoded samples -> rewards, by calling the selected scorer.

Import-light: params dataclasses and registration only; the managers live in
:mod:`rlzoo.algorithms.functional.reward`.

Each is a factory ``factory(params, scorer) -> manager``; ``scorer`` is
``scorer(response, ground_truth, data_source, extra_info) -> float | dict`` with its params
already bound (use :class:`rlzoo.algorithms.functional.reward.BoundScorer` to bind one so that it
also pickles, which ``process_pool`` needs). ``manager(items)`` returns one
:class:`rlzoo.protocols.RewardResult` per :class:`rlzoo.protocols.RewardItem`; a scorer that
raises, times out or returns NaN / inf / a non-number gives a failed result, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo import hookimpl, param

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
        help="seconds one sample's scorer may take (run in a helper thread, abandoned when late); "
        "null: no limit, called in the caller's thread",
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
        60.0, help="seconds one sample's scorer may take (as naive's); null: no limit"
    )


@dataclass(frozen=True)
class BatchParams:
    """Call a batched scorer once on the whole batch's lists.

    A scorer with the ``batched`` capability is called as ``scorer(responses, ground_truths,
    data_sources, extra_infos)`` and returns one float / dict per sample. If that call raises,
    each sample is retried alone (as a list of one) so only the bad ones fail. A scorer without
    the capability is called per sample, exactly like ``naive``.
    """

    failure_reward: float = param(0.0, help="reward of a sample whose scorer failed")
    timeout: float | None = param(
        60.0,
        help="seconds per sample: the batched call may take timeout x batch size (a late call fails "
        "every sample, without per-sample retries); null: no limit",
    )


@dataclass(frozen=True)
class ProcessPoolParams:
    """Score in a pool of worker processes, the whole batch within ``timeout`` seconds.

    Samples run in a ``ProcessPoolExecutor`` (spawn context) with at most ``num_workers`` in
    flight. The ``timeout`` is the batch's: every sample's clock starts with the call, so a batch
    of hanging samples fails after ``timeout`` seconds, not ``timeout`` x samples / workers; the
    late workers are then killed and a new pool serves the next call. A worker that dies makes
    the samples then in flight suspects: they are rerun one at a time, and one that kills its
    worker again is failed. The scorer must pickle: bind it with ``BoundScorer`` (a lazy
    ``"module:attr"`` target + params) or pass a module-level function.
    """

    num_workers: int = param(4, help="worker processes (0: os.cpu_count())")
    timeout: float = param(
        10.0, help="seconds the whole batch may take (all samples in parallel); later ones fail (> 0)"
    )
    failure_reward: float = param(0.0, help="reward of a sample whose scorer failed or timed out")


@hookimpl
def rlzoo_register_reward_managers(registry) -> None:  # type: ignore[no-untyped-def]
    registry.register("naive", f"{_IMPL}:NaiveRewardManager", params=NaiveParams)
    registry.register("dapo", f"{_IMPL}:DAPORewardManager", params=DAPOParams)
    registry.register(
        "batch", f"{_IMPL}:BatchRewardManager", params=BatchParams, capabilities={"batched": True}
    )
    registry.register("process_pool", f"{_IMPL}:ProcessPoolRewardManager", params=ProcessPoolParams)
