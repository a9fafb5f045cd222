"""Requests and batches: sampling params, generation requests, collation into the training layout,
and the per-batch rollout metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import GenerationRequest, RewardResult, Sample, SamplingParams
from rlzoo.recipe.types import RecipeConfig


def sampling_params(
    cfg: RecipeConfig, *, val: bool = False, n: int | None = None, seed: int | None = None
) -> SamplingParams:
    s = cfg.rollout.val if val else cfg.rollout
    greedy = s.temperature <= 0
    return SamplingParams(
        n=n if n is not None else s.n,
        temperature=1.0 if greedy else s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_new_tokens=cfg.data.max_response_length,
        greedy=greedy,
        seed=seed,
    )


def make_requests(
    items: Sequence[Mapping[str, Any]], sampling: SamplingParams, prefix: str, processor: Any = None
) -> list[GenerationRequest]:
    """One request per dataset item.

    An item with images gets ``multi_modal={"images": [...]}``; with a VL ``processor`` (see
    :func:`load_processor`) its ``prompt_ids`` are the processor's (one image token per merged
    patch) and ``multi_modal`` also holds ``pixel_values`` / ``image_grid_thw``
    (:func:`rlzoo.models.processor.expand_prompt`).
    """
    reqs = []
    for j, it in enumerate(items):
        data = {k: it.get(k) for k in ("ground_truth", "data_source", "extra_info", "prompt_text", "index")}
        seed = None if sampling.seed is None else sampling.seed * 1_000_003 + j
        sp = sampling if seed is None else SamplingParams(**{**sampling.__dict__, "seed": seed})
        images = it.get("images")
        prompt_ids = list(it["prompt_ids"])
        multi_modal: dict[str, Any] | None = {"images": images} if images else None
        if images and processor is not None:
            from rlzoo.models.processor import expand_prompt

            prompt_ids, pixels = expand_prompt(processor, it["prompt_text"], images)
            multi_modal = {"images": images, **pixels}
        reqs.append(
            GenerationRequest(
                request_id=f"{prefix}-{j}",
                prompt_ids=prompt_ids,
                sampling=sp,
                data=data,
                multi_modal=multi_modal,
            )
        )
    return reqs


def samples_to_batch(
    samples: Sequence[Sample],
    results: Sequence[RewardResult] | None,
    pad_token_id: int,
    *,
    max_response_length: int | None = None,
) -> Batch:
    """Collate samples into the training layout (see :mod:`rlzoo.kernel.batch`)."""
    B = len(samples)
    P = max(len(s.prompt_ids) for s in samples)
    T = max(max((len(s.response_ids) for s in samples), default=1), 1)
    if max_response_length:
        T = min(T, max_response_length)
    # rows as Python lists, then one tensor each: no per-sample tensor (the batch is small and many)
    ids_rows: list[list[int]] = []
    attn_rows: list[list[int]] = []
    rlp_rows: list[list[float]] = []
    score_rows: list[list[float]] = []
    mask_rows: list[list[int]] = []
    turn_rows: list[list[int]] = []
    for i, s in enumerate(samples):
        p = len(s.prompt_ids)
        r = list(s.response_ids[:T])
        n = len(r)
        lp = list(s.rollout_log_probs[:n])
        if len(lp) != n:
            raise ValueError(
                f"sample {s.request_id}/{s.index}: {len(s.rollout_log_probs)} rollout log-probs for "
                f"{len(s.response_ids)} response tokens (the rollout backend must give one per token)"
            )
        ids_rows.append([pad_token_id] * (P - p) + list(s.prompt_ids) + r + [pad_token_id] * (T - n))
        attn_rows.append([0] * (P - p) + [1] * (p + n) + [0] * (T - n))
        rlp_rows.append(lp + [0.0] * (T - n))
        # trained tokens: the sampled ones (a multi-turn trajectory's observations are context only)
        if s.loss_mask is None:
            mask = [1] * n
        else:
            if len(s.loss_mask) != len(s.response_ids):
                raise ValueError(
                    f"sample {s.request_id}/{s.index}: {len(s.loss_mask)} loss-mask entries for "
                    f"{len(s.response_ids)} response tokens (one per token)"
                )
            mask = [int(bool(m)) for m in s.loss_mask[:n]]
        mask_rows.append(mask + [0] * (T - n))
        turn_rows.append(_turn_ids(mask) + [-1] * (T - n))
        if results is not None:
            score_rows.append(_reward_row(s, results[i], mask, T))
    input_ids = torch.tensor(ids_rows, dtype=torch.long).reshape(B, P + T)
    attn = torch.tensor(attn_rows, dtype=torch.long).reshape(B, P + T)
    rlp = torch.tensor(rlp_rows, dtype=torch.float32).reshape(B, T)
    scores = (
        torch.tensor(score_rows, dtype=torch.float32).reshape(B, T)
        if results is not None
        else torch.zeros((B, T), dtype=torch.float32)
    )
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    response_mask = torch.tensor(mask_rows, dtype=torch.long).reshape(B, T)  # 1 on sampled tokens
    groups: dict[str, int] = {}
    gids = torch.tensor([groups.setdefault(s.request_id, len(groups)) for s in samples], dtype=torch.long)
    batch = Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attn,
            "position_ids": position_ids,
            "responses": input_ids[:, P:].clone(),
            "response_mask": response_mask,
            "rollout_log_probs": rlp,
            "token_level_scores": scores,
            "group_ids": gids,
        },
        {
            "uid": [s.uid for s in samples],
            "request_id": [s.request_id for s in samples],
            "data_source": [str(s.data.get("data_source", "default")) for s in samples],
            "versions": [list(s.versions) for s in samples],
            "finish_reason": [s.finish_reason for s in samples],
        },
    )
    if any(s.agent is not None for s in samples):  # multi-turn trajectories' records (agent/* metrics)
        batch["agent"] = [s.agent for s in samples]
        # each response token's model turn (-1: observation / padding), for per-turn advantages
        batch["turn_ids"] = torch.tensor(turn_rows, dtype=torch.long).reshape(B, T)
    routes = _routed_experts(samples, P, T)
    if routes is not None:  # a MoE rollout's routing, for a trainer that replays it
        batch["routed_experts"] = routes
    if any(s.multi_modal for s in samples):  # a VL trainer's pixel inputs, row by row (None: text)
        batch["multi_modal"] = [s.multi_modal for s in samples]
    if results is not None:
        batch["failed"] = [bool(r.failed) for r in results]
        batch["score"] = [float(r.score) for r in results]
        batch["acc"] = [float(r.info.get("acc", r.score)) for r in results]
        # what each scorer returned (its dict, with its score): advantages read reward components here
        batch["reward_info"] = [{"score": float(r.score), **r.info} for r in results]
    return batch


def _routed_experts(samples: Sequence[Sample], P: int, T: int) -> torch.Tensor | None:
    """``[B, P+T, layers, top_k]`` int16: each sample's recorded experts at its positions in the
    training layout (prompt left-padded to P), -1 where none was recorded (padding, the last
    response token, tokens past ``T``); None when no sample carries routes."""
    have = [s.routed_experts is not None for s in samples]
    if not any(have):
        return None
    if not all(have):
        bad = next(s for s, h in zip(samples, have) if not h)
        raise ValueError(
            f"sample {bad.request_id}/{bad.index} has no routed_experts while others of the batch do: "
            "every sample of a router-replay batch must come from a rollout that records routes"
        )
    first = samples[0].routed_experts
    assert first is not None
    out = torch.full((len(samples), P + T, *first.shape[1:]), -1, dtype=torch.int16)  # [B, S, L, k]
    for i, s in enumerate(samples):
        r = s.routed_experts
        assert r is not None
        if tuple(r.shape[1:]) != tuple(first.shape[1:]):
            raise ValueError(
                f"sample {s.request_id}/{s.index}: routed_experts of shape {tuple(r.shape)}, others have "
                f"[positions, {', '.join(map(str, first.shape[1:]))}] (one model's layers and top_k)"
            )
        p = len(s.prompt_ids)
        m = min(r.shape[0], p + min(len(s.response_ids), T))
        out[i, P - p : P - p + m] = r[:m].to(torch.int16)
    return out


def _turn_ids(mask: Sequence[int]) -> list[int]:
    """The model turn of each token: runs of mask 1 are the turns, 0-based; -1 where mask is 0."""
    out: list[int] = []
    turn, prev = -1, 0
    for m in mask:
        if m and not prev:
            turn += 1
        out.append(turn if m else -1)
        prev = m
    return out


def _reward_row(s: Sample, result: RewardResult, mask: Sequence[int], T: int) -> list[float]:
    """The sample's token-level scores: the reward on its last trained token, or, for a trajectory
    its environment rewarded turn by turn, each turn's reward on the last token of that turn.

    A per-turn reward is put on the end of the first model turn at or after its recorded position
    (a reward ``reset`` gave, position -1: the first turn; one past a cut response: the last
    turn). An environment's dense rewards (``token_rewards``: index in the response, reward) sit on
    their own tokens (one past a cut response: with the rest). Whatever part of the result's reward
    these do not account for goes on the last trained token, so the row always sums to the
    result's reward.
    """
    row = [0.0] * T
    n = len(mask)
    if not n:
        return row
    last = max((j for j in range(n) if mask[j]), default=n - 1)  # the last trained token
    reward = float(result.reward)
    rec = s.agent
    if rec is not None and not result.failed and rec.get("reward") is not None:
        ends = [j for j in range(n) if mask[j] and (j + 1 == n or not mask[j + 1])]  # turns' last tokens
        positions = rec.get("turn_reward_positions") or []
        for r, p in zip(rec.get("turn_rewards") or [], positions):
            at = next((e for e in ends if e >= p), last)
            row[at] += float(r)
            reward -= float(r)
        for p, r in rec.get("token_rewards") or []:  # dense rewards: each on its own (sampled) token
            if 0 <= p < n and mask[p]:
                row[p] += float(r)
                reward -= float(r)
    row[last] += reward
    return row


def clip_ratio(
    resp_len: torch.Tensor, finish_reasons: Sequence[str] | None, max_response_length: int
) -> float:
    """Share of responses cut off by the length limit: they reached ``max_response_length`` tokens
    without ending in EOS (finish reason other than ``"stop"``). A response whose EOS is exactly
    the last allowed token is complete, not clipped. Without finish reasons, length alone decides."""
    hit = resp_len >= max_response_length  # [B]
    if finish_reasons is not None:
        no_eos = torch.tensor([r != "stop" for r in finish_reasons], dtype=torch.bool)  # [B]
        hit = hit & no_eos
    return hit.float().mean().item()


def rollout_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    resp_len = batch["response_mask"].sum(-1).float()  # [B] trained (sampled) tokens
    P = batch["attention_mask"].shape[1] - batch["response_mask"].shape[1]
    prompt_len = batch["attention_mask"][:, :P].sum(-1).float()  # [B]
    seq_scores = batch["token_level_scores"].sum(-1)  # [B]
    out = {
        "critic/score/mean": seq_scores.mean().item(),
        "critic/score/max": seq_scores.max().item(),
        "critic/score/min": seq_scores.min().item(),
        "response_length/mean": resp_len.mean().item(),
        "response_length/max": resp_len.max().item(),
        "response_length/min": resp_len.min().item(),
        "response_length/clip_ratio": clip_ratio(resp_len, batch.get("finish_reason"), max_response_length),
        "prompt_length/mean": prompt_len.mean().item(),
        "reward/failed": float(sum(batch.get("failed", []) or [0])),
    }
    if "acc" in batch:
        out["critic/acc/mean"] = sum(batch["acc"]) / max(len(batch), 1)
    if "agent" in batch:
        from rlzoo.agents.rollout import agent_metrics

        out.update(agent_metrics(batch["agent"]))
    # staleness and version spans are the loop's (rlzoo.train.loop.version_metrics): they are
    # counted in policy versions, which only the loop knows
    return out
