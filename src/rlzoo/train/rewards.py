"""Rewards: scorer dispatch, scoring samples, the sample filter's view of a sample, validation scores."""

from __future__ import annotations

import logging
import math
import traceback
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from rlzoo.kernel.protocols import RewardItem, RewardResult, Sample
from rlzoo.recipe.types import RecipeConfig, Selection

logger = logging.getLogger("rlzoo")

_F32_MAX = 3.4028234663852886e38  # the largest finite float32 (rewards travel in float32 tensors)


class ScorerDispatch:
    """``scorer(response, ground_truth, data_source, extra_info)`` choosing a scorer per data source.

    Picklable (it holds lazy ``module:attr`` targets and params), so process-pool reward managers
    can ship it to workers. :attr:`batched` (the reward managers' ``BatchedScorer``) is True when
    every scorer it routes to has the ``batched`` capability: then it takes and returns lists, and
    calls each scorer once with its data sources' share of the batch. A batched scorer called for
    one sample gets a one-element list.
    """

    def __init__(self, default: Selection, by_source: Mapping[str, Selection]) -> None:
        def entry(sel: Selection) -> tuple[Any, Any, bool]:
            return (sel.component.target, sel.params, bool(sel.capability("batched")))

        self._default = entry(default)
        self._by_source = {k: entry(s) for k, s in by_source.items() if s is not None}
        self._cache: dict[Any, Any] = {}

    @property
    def batched(self) -> bool:
        return all(e[2] for e in (self._default, *self._by_source.values()))

    def _fn(self, target: Any) -> Any:
        if not isinstance(target, str):
            return target
        if target not in self._cache:
            from rlzoo.kernel.registry import _resolve

            self._cache[target] = _resolve(target)
        return self._cache[target]

    def __call__(self, response: Any, ground_truth: Any, data_source: Any, extra_info: Any) -> Any:
        if self.batched:
            return self._call_lists(response, ground_truth, data_source, extra_info)
        target, params, batched = self._by_source.get(data_source, self._default)
        if batched:
            (raw,) = self._fn(target)([response], [ground_truth], [data_source], [extra_info], params)
            return raw
        return self._fn(target)(response, ground_truth, data_source, extra_info, params)

    def _call_lists(
        self,
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        data_sources: Sequence[str],
        extra_infos: Sequence[Mapping[str, Any]],
    ) -> list[Any]:
        groups: dict[str | None, list[int]] = defaultdict(list)  # scorer (by the sources it serves) -> rows
        for i, src in enumerate(data_sources):
            groups[src if src in self._by_source else None].append(i)
        out: list[Any] = [None] * len(responses)
        for key, rows in groups.items():
            target, params, _ = self._default if key is None else self._by_source[key]
            raws = list(
                self._fn(target)(
                    [responses[i] for i in rows],
                    [ground_truths[i] for i in rows],
                    [data_sources[i] for i in rows],
                    [extra_infos[i] for i in rows],
                    params,
                )
            )
            if len(raws) != len(rows):
                raise ValueError(
                    f"batched scorer {target!r} returned {len(raws)} results for {len(rows)} samples"
                )
            for i, raw in zip(rows, raws):
                out[i] = raw
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"_default": self._default, "_by_source": self._by_source, "_cache": {}}


def build_reward_manager(cfg: RecipeConfig) -> Any:
    mgr = cfg.reward.manager
    scorer = ScorerDispatch(cfg.reward.scorer, cfg.reward.scorers)
    return mgr.fn(mgr.params, scorer)


@dataclass(frozen=True)
class PartNames:
    """Which part a failed sample blames (``info["failed_part"]``: kind, then registered name)."""

    manager: str = "unknown"
    scorer: str = "unknown"
    scorers: Mapping[str, str] = field(default_factory=dict)  # data source -> scorer name
    environment: str | None = None

    @classmethod
    def of(cls, cfg: RecipeConfig) -> PartNames:
        env = cfg.rollout.environment
        return cls(
            manager=cfg.reward.manager.name,
            scorer=cfg.reward.scorer.name,
            scorers={k: s.name for k, s in cfg.reward.scorers.items() if s is not None},
            environment=env.name if env is not None else None,
        )

    def scorer_for(self, data_source: str) -> str:
        return f"scorer {self.scorers.get(data_source, self.scorer)}"


def score_samples(
    reward_manager: Any, tokenizer: Any, samples: Sequence[Sample], names: PartNames | None = None
) -> list[RewardResult]:
    """Decode and score samples; a manager that raises marks the whole call failed, never the run.

    A multi-turn trajectory (``sample.agent`` set) whose environment gave rewards is scored by them
    (their sum; the environment's info numbers, e.g. ``acc``, are its info); one whose environment
    failed, or gave a reward that is not a finite float32 (NaN, inf, 1e300), is a failed result
    carrying the error (counted like a scorer failure: ``reward/failed``, the failure streak).
    Otherwise the scorer judges the model's final turn. Each failed result names its part
    (``info["failed_part"]``, from ``names``): the environment, the scorer of its data source, or
    the reward manager when the manager itself raised.
    """
    names = names or PartNames()
    env_results = [_env_result(s, names) for s in samples]
    scored = [s for s, r in zip(samples, env_results) if r is None]
    results = iter(_score(reward_manager, tokenizer, scored, names) if scored else [])
    return [r if r is not None else next(results) for r in env_results]


def _finite32(x: Any) -> bool:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return False
    return math.isfinite(v) and abs(v) <= _F32_MAX


def _env_result(s: Sample, names: PartNames) -> RewardResult | None:
    rec = s.agent
    if rec is None:
        return None
    part = f"environment {names.environment or 'unknown'}"
    if rec.get("error"):
        failure = rec.get("failure") or {}  # the rollout's record: {kind, part, message, traceback}
        message = str(rec["error"])
        info = {
            "error": message if failure else f"environment: {message}",
            "failed_part": str(failure.get("part") or part),
        }
        tb = failure.get("traceback")
        if tb:  # into the result: failures.jsonl keeps it, the batch does not
            info["traceback"] = tb
            failure["traceback"] = None
        return RewardResult(0.0, 0.0, True, info)
    if rec.get("reward") is None:
        return None
    bad = [r for r in (rec.get("turn_rewards") or []) if not _finite32(r)]
    bad += [r for _, r in (rec.get("token_rewards") or []) if not _finite32(r)]
    if bad or not _finite32(rec["reward"]):
        shown = bad[0] if bad else rec["reward"]
        return RewardResult(
            0.0,
            0.0,
            True,
            {
                "error": f"environment: reward {shown!r} is not a finite float32 (|r| <= {_F32_MAX:.4g})",
                "failed_part": part,
            },
        )
    reward = float(rec["reward"])
    info = dict(rec.get("env_info") or {})
    return RewardResult(reward, reward, False, info)


def _score(
    reward_manager: Any, tokenizer: Any, samples: Sequence[Sample], names: PartNames
) -> list[RewardResult]:
    items = [
        RewardItem(
            response=(
                str(s.agent["final_text"])
                if s.agent is not None
                else tokenizer.decode(s.response_ids, skip_special_tokens=True)
            ),
            ground_truth=s.data.get("ground_truth"),
            data_source=str(s.data.get("data_source", "default")),
            prompt=str(s.data.get("prompt_text", "")),
            response_length=len(s.response_ids),
            finish_reason=s.finish_reason,
            extra_info=s.data.get("extra_info") or {},
        )
        for s in samples
    ]
    manager = f"reward_manager {names.manager}"
    try:
        results = list(reward_manager(items))
        if len(results) != len(items):
            raise ValueError(f"the reward manager returned {len(results)} results for {len(items)} samples")
    except Exception as exc:  # a broken manager: count every sample as failed
        tb = traceback.format_exc()
        return [
            RewardResult(0.0, 0.0, True, {"error": repr(exc), "failed_part": manager, "traceback": tb})
            for _ in items
        ]
    for it, r in zip(items, results):
        # a manager's own reward (e.g. dapo's penalty added) must fit the float32 tensor
        if not (isinstance(r.reward, (int, float)) and _finite32(r.reward) and _finite32(r.score)):
            r.info.setdefault(
                "error", f"the reward manager returned reward {r.reward!r}, not a finite float32"
            )
            r.info.setdefault("failed_part", manager)
            r.reward, r.score, r.failed = 0.0, 0.0, True
        if r.failed:
            r.info.setdefault("failed_part", names.scorer_for(it.data_source))
    return results


def guard_rewards(batch: Any) -> int:
    """Fail the rows of a collated batch whose token rewards are not finite (a runner or collation
    that let one through): their rewards become 0, ``failed`` True and the error says so, so the
    update and the metrics never see NaN / inf and the failure policy counts them. Returns how many."""
    import torch

    scores = batch["token_level_scores"]  # [B, T]
    bad = ~torch.isfinite(scores).all(-1)  # [B]
    if not bool(bad.any()):
        return 0
    scores[bad] = 0.0
    rows = [i for i, b in enumerate(bad.tolist()) if b]
    n = scores.shape[0]
    failed = list(batch.get("failed") or [False] * n)
    infos = [dict(x) for x in (batch.get("reward_info") or [{"score": 0.0} for _ in range(n)])]
    for i in rows:
        failed[i] = True
        infos[i].setdefault("error", "a non-finite reward reached the training batch")
        infos[i].setdefault("failed_part", "reward unknown")
    batch["failed"] = failed
    batch["reward_info"] = infos
    return len(rows)


def validation_metrics(
    samples: Sequence[Sample], results: Sequence[RewardResult], n: int
) -> dict[str, float]:
    """mean@n, best@n and maj@n (when scorers report ``pred``) per data source and overall."""
    groups: dict[str, list[tuple[Sample, RewardResult]]] = defaultdict(list)
    for s, r in zip(samples, results):
        groups[s.request_id].append((s, r))
    per_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for members in groups.values():
        source = str(members[0][0].data.get("data_source", "default"))
        accs = [float(r.info.get("acc", r.score)) for _, r in members]
        per_source[source][f"mean@{n}"].append(sum(accs) / len(accs))
        per_source[source][f"best@{n}"].append(max(accs))
        preds = [r.info.get("pred") for _, r in members]
        if all(p is not None for p in preds):
            top = Counter(map(str, preds)).most_common(1)[0][0]
            per_source[source][f"maj@{n}"].append(next(a for p, a in zip(map(str, preds), accs) if p == top))
    out: dict[str, float] = {}
    overall: list[float] = []
    for source, stats in per_source.items():
        for k, v in stats.items():
            out[f"val/{source}/{k}"] = sum(v) / len(v)
        overall += stats[f"mean@{n}"]
    if overall:
        out["val/mean"] = sum(overall) / len(overall)
    out["val/response_length/mean"] = sum(len(s.response_ids) for s in samples) / max(len(samples), 1)
    return out


# ---------------------------------------------------------------------------------------------
# The sample filter's view of samples (one implementation for every runner)
# ---------------------------------------------------------------------------------------------
def filter_value(result: RewardResult, metric: str) -> float:
    """What a sample filter judges a sample by: ``reward``, ``score`` or a scorer's info key (``acc``)."""
    if metric == "reward":
        return float(result.reward)
    if metric == "score":
        return float(result.score)
    return float(result.info.get(metric, result.score))


def keep_mask(
    sample_filter: Selection, metric: str, samples: Sequence[Sample], results: Sequence[RewardResult]
) -> list[bool]:
    """The filter's keep mask over ``samples`` (groups by request id), judged on ``metric``."""
    import torch

    values = torch.tensor([filter_value(r, metric) for r in results], dtype=torch.float32)  # [N]
    ids: dict[str, int] = {}
    gids = torch.tensor([ids.setdefault(s.request_id, len(ids)) for s in samples], dtype=torch.long)  # [N]
    return [bool(k) for k in sample_filter(values, gids).tolist()]


# ---------------------------------------------------------------------------------------------
# Reward components (advantages that declare needs_reward_components, e.g. gdpo)
# ---------------------------------------------------------------------------------------------
def reward_components(batch: Any, keys: Sequence[str], who: str) -> Any:
    """``[B, K]`` float32: each sample's reward info value under each of ``keys``, in that order.

    The info is what the scorer returned (its dict, plus ``score``; ``batch["reward_info"]``). A
    sample whose scoring failed gets 0 for a key it lacks; any other missing or non-numeric value is
    an error naming the key and what the scorer returned (``who``: the part, for the message).
    """
    import torch

    infos = batch.get("reward_info")
    if infos is None:
        raise ValueError(
            f"{who}: reward_keys {list(keys)} need each sample's reward info, but the batch has no "
            "reward_info (it was not collated from scored samples)"
        )
    failed = batch.get("failed") or [False] * len(infos)
    uids = batch.get("uid") or [str(i) for i in range(len(infos))]
    rows: list[list[float]] = []
    for info, bad, uid in zip(infos, failed, uids):
        row = []
        for key in keys:
            if key not in info:
                if bad:
                    row.append(0.0)
                    continue
                raise ValueError(
                    f"{who}: reward key {key!r} (algorithm.advantage.reward_keys={list(keys)}) is not in "
                    f"what the scorer returned for sample {uid}: {_shown(info)}. Name keys the scorer "
                    "returns (its dict besides 'score', or 'score'), or set reward_keys=[] to use the "
                    "outcome reward alone"
                )
            value = info[key]
            value = value.item() if hasattr(value, "item") else value  # numpy / torch scalars
            if not isinstance(value, Real):
                raise ValueError(
                    f"{who}: reward key {key!r} of sample {uid} is {info[key]!r}, not a number "
                    f"(the scorer returned {_shown(info)})"
                )
            row.append(float(value))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(keys))  # [B, K]


def _shown(info: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in sorted(info.items())) + "}"
