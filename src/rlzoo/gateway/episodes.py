"""An episode's calls, recorded as ids, and the training samples they make.

Every call the gateway serves is recorded as a :class:`Call`: the prompt ids the engine was fed,
the ids it sampled, their log-probs and the policy version of each token. When the episode ends,
:func:`episode_samples` chains the calls by their ids alone:

- a call whose prompt ids start with a chain's ``prompt + response`` (the last call it holds
  extended: the agent kept its history) joins that chain: the ids between (the template's rendering
  of the tool results or the user's reply) with loss mask 0, then its sampled ids with mask 1, as
  :class:`~rlzoo.agents.rollout.MultiTurnRollout` builds a trajectory;
- any other call starts a chain of its own, counted in the episode's ``splits`` by why (the reason
  the gateway recorded when it rendered that call's prompt whole: the agent edited or re-rendered
  its history, the turn before ran out of tokens, another choice of ``n``; or ``too_long``: the
  chain had no response budget left).

Each chain is one :class:`~rlzoo.kernel.protocols.Sample`; every sample of an episode shares its
reward. A call's dense rewards (:attr:`Call.token_rewards`, one per sampled token: what an
environment judging the episode gave, as the native path's ``EnvStep.token_rewards``) sit on that
call's own tokens in its chain. Sampled ids are never decoded and encoded again: the trained ids
are the engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlzoo.kernel.protocols import GenerationRequest, Sample

__all__ = ["Call", "SplitRefused", "episode_samples"]

#: why a call's prompt was rendered whole rather than as the extension of an earlier call
FIRST = "first"


class SplitRefused(Exception):
    """The episode's calls do not make one trajectory and ``rollout.gateway.split`` is 'refuse'."""


@dataclass
class Call:
    """One sampled choice of one gateway call, as the engine produced it."""

    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    versions: list[int]
    finish_reason: str
    #: why the prompt was rendered whole (``first``, ``history_edited``, ``unclosed_turn``, ``choice``,
    #: ``text_prompt``); None: it was rendered as the extension of an earlier call's ids
    why_fresh: str | None = FIRST
    tool_calls: int = 0
    malformed_calls: int = 0
    text: str = ""  # the reply's text as the agent read it (decoded)
    #: the well-formed tool calls read from the reply, and the tool results the agent sent back
    #: after it (the next call that extended it), as an environment judging the episode reads them
    parsed_calls: tuple[Any, ...] = ()
    tool_results: tuple[str, ...] = ()
    #: a reward per sampled token (empty: none), put on those tokens
    token_rewards: list[float] = field(default_factory=list)


@dataclass
class _Chain:
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    token_rewards: list[tuple[int, float]] = field(default_factory=list)  # (index in response, reward)

    @property
    def full(self) -> list[int]:
        return [*self.prompt, *self.response]

    def add(self, call: Call, delta: Sequence[int]) -> None:
        version = self.versions[-1] if self.versions else (call.versions[0] if call.versions else 0)
        start = len(self.response) + len(delta)
        self.token_rewards += [(start + j, float(r)) for j, r in enumerate(call.token_rewards)]
        self.response += [*delta, *call.response_ids]
        self.mask += [0] * len(delta) + [1] * len(call.response_ids)
        self.log_probs += [0.0] * len(delta) + list(call.log_probs)
        self.versions += [version] * len(delta) + list(call.versions)
        self.calls.append(call)


def _chains(calls: Sequence[Call], max_response_length: int) -> tuple[list[_Chain], dict[str, int]]:
    chains: list[_Chain] = []
    splits: dict[str, int] = {}
    for call in calls:
        best: _Chain | None = None
        for ch in chains:
            full = ch.full
            extends = len(call.prompt_ids) >= len(full) and call.prompt_ids[: len(full)] == full
            if extends and (best is None or len(full) > len(best.full)):
                best = ch
        if best is not None:
            size = len(call.prompt_ids) - len(best.prompt) + len(call.response_ids)
            if size <= max_response_length:
                best.add(call, call.prompt_ids[len(best.full) :])
                continue
        if chains:
            why = "too_long" if best is not None else (call.why_fresh or "history_edited")
            splits[why] = splits.get(why, 0) + 1
        ch = _Chain(prompt=list(call.prompt_ids))
        ch.add(call, ())
        chains.append(ch)
    return chains, splits


def episode_samples(
    request: GenerationRequest,
    index: int,
    calls: Sequence[Call],
    *,
    max_response_length: int,
    reward: float | None,
    final_text: str | None,
    failure: Mapping[str, Any] | None,
    info: Mapping[str, float],
    refuse_splits: bool = False,
    late_calls: int = 0,
    refused_calls: int = 0,
    agent_time_s: float = 0.0,
) -> list[Sample]:
    """The episode's training samples (module docstring): one per chain of extending calls.

    ``failure`` (the agent raised, timed out, returned garbage; ``{kind, part, message,
    traceback}``) fails every sample (scored as failed: ``reward/failed``). An episode without a
    call is one empty sample carrying the failure (or the reward). Raises :class:`SplitRefused`
    when the calls make more than one chain and ``refuse_splits``.
    """
    chains, splits = _chains(calls, max_response_length)
    if refuse_splits and splits:
        why = ", ".join(f"{k} x{v}" for k, v in sorted(splits.items()))
        raise SplitRefused(
            f"the episode's {len(calls)} calls make {len(chains)} trajectories ({why}), and "
            "rollout.gateway.split is 'refuse': keep the conversation's history as the gateway returned it, "
            "or set rollout.gateway.split=split"
        )
    if not chains:
        chains = [_Chain(prompt=list(request.prompt_ids))]
    last_text = calls[-1].text if calls else ""
    out: list[Sample] = []
    for k, ch in enumerate(chains):
        model_tokens = sum(ch.mask)
        finish = ch.calls[-1].finish_reason if ch.calls else "stop"
        finish = "stop" if finish == "stop_string" else finish
        message = None if failure is None else str(failure.get("message", "agent failed"))
        dense = sum(r for _, r in ch.token_rewards)
        out.append(
            Sample(
                request_id=request.request_id,
                index=index,
                prompt_ids=ch.prompt,
                response_ids=ch.response,
                rollout_log_probs=ch.log_probs,
                versions=ch.versions,
                finish_reason=finish,
                data=dict(request.data),
                multi_modal=request.multi_modal,
                loss_mask=ch.mask,
                agent={
                    "turns": len(ch.calls),
                    "tool_calls": sum(c.tool_calls for c in ch.calls),
                    "tool_errors": sum(c.malformed_calls for c in ch.calls),
                    "malformed_calls": sum(c.malformed_calls for c in ch.calls),
                    # the episode's reward and this sample's dense rewards, as the native path sums them
                    "reward": (
                        None if reward is None and not ch.token_rewards else float(reward or 0.0) + dense
                    ),
                    "turn_rewards": [],
                    "turn_reward_positions": [],
                    "token_rewards": [[p, r] for p, r in ch.token_rewards],
                    "env_time_s": agent_time_s,
                    "truncated": finish == "length",
                    "model_tokens": model_tokens,
                    "env_tokens": len(ch.response) - model_tokens,
                    "final_text": final_text if final_text is not None else last_text,
                    "error": message,
                    "failure": None if failure is None else dict(failure),
                    "tool_failures": [],
                    "abandoned_calls": 0,
                    "observations_truncated": 0,
                    "final_messages": [],
                    "env_info": dict(info),
                    # the episode's own counts sit on its first sample only (they sum over a batch)
                    "gateway": {
                        "segment": k,
                        "segments": len(chains),
                        "calls": len(calls) if k == 0 else 0,
                        "splits": dict(splits) if k == 0 else {},
                        "late_calls": late_calls if k == 0 else 0,
                        "refused_calls": refused_calls if k == 0 else 0,
                    },
                },
            )
        )
    return out
