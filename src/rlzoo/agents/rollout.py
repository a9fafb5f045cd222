"""``MultiTurnRollout``: multi-turn, tool-calling trajectories on any rollout backend.

It is composed over a :class:`~rlzoo.kernel.protocols.RolloutBackend` (the engine) and is one itself:
every method of that Protocol, and only those (``submit`` / ``stream`` / ``generate`` / ``pause`` /
``resume`` / ``update_weights`` / ``num_pending`` / ``shutdown`` / ``version``), so the sync,
one-step-off and fully-async batch sources use it unchanged. Whatever else a caller wants of the
engine (``abort()``, a weight sync's report), it asks the engine it holds itself. Each trajectory is a chain of single-turn requests on
the inner backend: the context so far (prompt + every turn's ids) is the next request's prompt.
Because every trajectory's next turn is an ordinary request, the engine's continuous batching
spans turns: a trajectory waiting on its tool or environment holds no slot, and the others keep
decoding.

Environment and tool calls run on a :class:`~rlzoo.agents.loop.SideLoop` (an asyncio loop on its own
thread, each sync call on a daemon thread of its own, ``async`` ones awaited there), each under its
timeout, so a slow environment never blocks the engine or the caller, and one that hangs for ever
is abandoned at its timeout (its slot given back, the process free to exit). What user code
returns is checked at the boundary (:mod:`rlzoo.agents.boundary`); a :class:`~rlzoo.agents.loop.Pump` moves
trajectories along on the caller's thread. This module is only the trajectory logic.

The trajectory (a :class:`~rlzoo.kernel.protocols.Sample`): ``prompt_ids`` = the first observation
rendered with the chat template; ``response_ids`` = per turn the sampled ids (``loss_mask`` 1,
their rollout log-probs and policy versions as the engine gave them) followed by the
observation's ids (``loss_mask`` 0, log-prob 0, the version of the turn before). Sampled ids are
never decoded and encoded again: the text of a turn is decoded only for the parser and the
environment to read. ``Sample.agent`` records the trajectory (turns, tool calls, errors, rewards,
environment time, token counts, a failure); :func:`agent_metrics` turns a batch of them into
``agent/*`` metrics.

A trajectory ends when the environment says ``done``, after ``max_turns`` model turns, when a
turn ends without its stop token (``finish_reason`` ``length``: the per-turn or the whole budget
ran out), when the next observation does not fit the response budget (``length``), or when user
code fails (the environment raises -- a ``BaseException`` too --, times out or returns a bad value;
or a tool raises ``SystemExit`` & co.: ``agent["error"]``, and ``agent["failure"]`` with its kind, part,
message and traceback; scoring counts it as a failed sample).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from rlzoo.agents.boundary import Failure, cut, failure_of, step_problem, text_problem
from rlzoo.agents.chat import ChatTemplate
from rlzoo.agents.loop import CallTimeout, Event, Finished, OverEngine, Pump, SideLoop, UserCodeError
from rlzoo.agents.parsing import parse_tool_calls, schema_problems
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.kernel.protocols import (
    AgentTurn,
    Environment,
    EnvStep,
    GenerationRequest,
    Message,
    RolloutBackend,
    Sample,
    Tool,
    ToolCall,
)

__all__ = ["MultiTurnRollout", "agent_metrics"]

#: tool failures kept per trajectory (all are counted in tool_errors)
MAX_TOOL_FAILURES = 8
_ENV_LIMIT = "rollout.multi_turn.env_timeout_s"


@dataclass
class _Traj:
    """One trajectory in flight."""

    request: GenerationRequest
    index: int
    env: Environment | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    template: ChatTemplate | None = None
    conversation: list[Message] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0
    rewards: list[float] = field(default_factory=list)
    #: per reward, the index in response_ids of the last token of the model turn it rewards
    #: (-1: given by reset, before any turn; the batch credits the first turn)
    reward_positions: list[int] = field(default_factory=list)
    env_time_s: float = 0.0
    final_text: str = ""
    truncated: bool = False
    #: why the trajectory failed (user code timed out, raised or returned a bad value)
    failure: Failure | None = None
    #: tools' failures the model read as error observations (at most MAX_TOOL_FAILURES kept)
    tool_failures: list[dict[str, str]] = field(default_factory=list)
    abandoned_calls: int = 0  # sync calls left running past their timeout
    observations_truncated: int = 0  # messages cut to max_observation_chars
    final_messages: list[Message] = field(default_factory=list)  # given with done: read by no turn
    env_info: dict[str, float] = field(default_factory=dict)
    pending_calls: list[ToolCall] = field(default_factory=list)  # since the env's last step
    pending_results: list[str] = field(default_factory=list)
    #: [start, end) in response_ids of each model turn since the env's last step
    pending_spans: list[tuple[int, int]] = field(default_factory=list)
    #: (index in response_ids, reward): the environment's dense rewards, each on its own token
    token_rewards: list[tuple[int, float]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return (self.request.request_id, self.index)


class MultiTurnRollout(OverEngine):
    """A :class:`~rlzoo.kernel.protocols.RolloutBackend` running multi-turn trajectories on ``inner``.

    Args:
        inner: the rollout backend that samples each turn (native engine, vLLM, ...); weights and
            pauses go to it, and :meth:`shutdown` shuts it down too.
        make_env: builds one environment per trajectory (the selected part's factory, bound).
        tools: tools offered on top of each environment's own.
        tokenizer: the model's tokenizer (chat template; decoding turns for reading).
        settings: ``rollout.multi_turn``.
        max_response_length: the response budget of a trajectory (every token after the prompt).
        max_prompt_length: the prompt budget: a longer first observation fails its trajectory
            (None: unbounded).
        env_name: the environment's part name, for failures (``"environment <name>"``).
        stop_ids: ids that end a model turn (EOS).
        template_kwargs: extra ``apply_chat_template`` arguments.
    """

    def __init__(
        self,
        inner: RolloutBackend,
        make_env: Callable[[], Environment],
        tokenizer: Any,
        settings: MultiTurnSettings,
        *,
        max_response_length: int,
        stop_ids: Sequence[int],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, Any] | None = None,
        max_prompt_length: int | None = None,
        env_name: str | None = None,
    ) -> None:
        self.inner = inner
        self.make_env = make_env
        self.tokenizer = tokenizer
        self.settings = settings
        self.max_response_length = int(max_response_length)
        self.max_prompt_length = None if max_prompt_length is None else int(max_prompt_length)
        self.env_part = f"environment {env_name}" if env_name else "environment"
        self.stop_ids = tuple(int(t) for t in stop_ids)
        self.extra_tools = list(tools)
        self.template_kwargs = dict(template_kwargs or {})
        self._lock = threading.RLock()
        self._by_turn: dict[str, _Traj] = {}  # inner request id -> trajectory
        self._side: SideLoop[_Traj] = SideLoop(settings.concurrency)
        self._pump = Pump(
            self._side,
            inner,
            engine_busy=self._on_engine,
            on_event=self._handle_event,
            on_sample=self._on_turn,
        )
        self._finished = Finished(self._lock, self._pump)

    # ------------------------------------------------------------------------------------------
    # RolloutBackend
    # ------------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self._lock:
            for req in requests:
                for i in range(req.sampling.n):
                    traj = _Traj(request=req, index=i)
                    self._finished.start()
                    self._side.spawn("reset", traj, self._reset(traj))

    def shutdown(self) -> None:
        self._side.close()
        self.inner.shutdown()

    # ------------------------------------------------------------------------------------------
    # what the pump asks
    # ------------------------------------------------------------------------------------------
    def _on_engine(self) -> bool:
        """Whether some trajectory's turn is on the engine."""
        with self._lock:
            return bool(self._by_turn)

    # -- environment and tools (on the loop thread) ----------------------------------------------
    async def _env_call(self, traj: _Traj, call: str, fn: Callable[..., Any], *args: Any) -> Any:
        """The environment's ``call`` (``fn(*args)``) under ``env_timeout_s``; a failure raised as
        :class:`Failure` (the trajectory fails)."""
        limit = f"{self.env_part} {call} exceeded {{timeout}} ({_ENV_LIMIT})"
        t0 = time.perf_counter()
        try:
            return await self._side.call(fn, *args, timeout=self.settings.env_timeout_s, limit=limit)
        except Exception as exc:
            if isinstance(exc, CallTimeout) and exc.abandoned:
                traj.abandoned_calls += 1
            raise failure_of(exc, self.env_part, call) from exc
        finally:
            traj.env_time_s += time.perf_counter() - t0

    def _bad(self, call: str, problem: str) -> Failure:
        return Failure("bad_value", self.env_part, f"{self.env_part} {call} {problem}")

    def _checked(self, traj: _Traj, call: str, out: Any) -> EnvStep:
        """``out`` if it is a usable ``EnvStep`` (its messages cut to size), else a :class:`Failure`."""
        problem = step_problem(out, first=call == "reset", max_abs_reward=self.settings.max_abs_reward)
        if problem is not None:
            raise self._bad(call, problem)
        limit = self.settings.max_observation_chars
        if call == "reset":
            size = sum(len(m["content"]) for m in out.messages)
            if size > limit:
                raise self._bad(
                    call,
                    f"returned a first observation of {size} characters, more than "
                    f"rollout.multi_turn.max_observation_chars={limit}",
                )
            return out
        messages, n = cut(out.messages, limit)
        traj.observations_truncated += n
        return dataclasses.replace(out, messages=messages) if n else out

    async def _reset(self, traj: _Traj) -> EnvStep:
        env = await self._env_call(traj, "factory", self.make_env)
        traj.env = env
        row = {**traj.request.data, "prompt_ids": list(traj.request.prompt_ids)}
        out = self._checked(traj, "reset", await self._env_call(traj, "reset", env.reset, row))
        own = await self._env_call(traj, "tools", env.tools)
        if not isinstance(own, Sequence) or isinstance(own, str):
            raise self._bad("tools", f"must return a sequence of tools, got {type(own).__name__}")
        tools = [*own, *self.extra_tools]
        for t in tools:
            timeout = getattr(t, "timeout_s", None)
            if (
                isinstance(timeout, bool)
                or not isinstance(timeout, Real)
                or not 0 < float(timeout) < math.inf
            ):
                raise self._bad(
                    "tools",
                    f"offers tool {getattr(t, 'name', t)!r} with timeout_s {timeout!r}: "
                    "it must be a finite number of seconds > 0",
                )
        names = [t.name for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise self._bad(
                "tools",
                f"offers tools named {twice} more than once (its own and rollout.tools): one would "
                "hide the other; rename or drop one",
            )
        traj.tools = {t.name: t for t in tools}
        traj.template = ChatTemplate(self.tokenizer, tools, self.stop_ids, self.template_kwargs)
        return out

    async def _step(self, traj: _Traj, turn: AgentTurn, spans: list[tuple[int, int]]) -> EnvStep:
        assert traj.env is not None
        out = self._checked(traj, "step", await self._env_call(traj, "step", traj.env.step, turn))
        if out.token_rewards is not None:
            want = [len(t) for t in turn.turn_tokens]
            got = [len(r) for r in out.token_rewards]
            if got != want:
                raise self._bad(
                    "step",
                    f"returned token_rewards that must hold one list per turn of turn.turn_tokens with one "
                    f"reward per token: token counts {want}, got reward counts {got}",
                )
            traj.token_rewards += [
                (a + j, float(r)) for (a, _), rs in zip(spans, out.token_rewards) for j, r in enumerate(rs)
            ]
        return out

    async def _run_tools(self, traj: _Traj, calls: list[ToolCall]) -> list[Message]:
        """One tool message per call, in the turn's order (its text, or the error the model reads;
        a malformed call is not made); counted on the trajectory."""
        messages: list[Message] = []
        t0 = time.perf_counter()
        for call in calls:
            if call.malformed is not None:
                traj.tool_errors += 1
                traj.malformed_calls += 1
                text = f"error: {call.malformed}"
                message: Message = {"role": "tool", "content": text}
            else:
                traj.tool_calls += 1
                text, failed = await self._one_tool(traj, call)
                traj.tool_errors += int(failed)
                message = {"role": "tool", "name": call.name, "content": text}
            (message,), n = cut([message], self.settings.max_observation_chars)
            traj.observations_truncated += n
            traj.pending_calls.append(call)
            traj.pending_results.append(message["content"])
            messages.append(message)
        traj.env_time_s += time.perf_counter() - t0
        return messages

    def _tool_failure(self, traj: _Traj, failure: Failure) -> tuple[str, bool]:
        if len(traj.tool_failures) < MAX_TOOL_FAILURES:
            traj.tool_failures.append(failure.record())
        return f"error: {failure.message}", True

    async def _one_tool(self, traj: _Traj, call: ToolCall) -> tuple[str, bool]:
        tool = traj.tools.get(call.name)
        if tool is None:
            return (
                f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(traj.tools)) or 'none'}",
                True,
            )
        if traj.tool_calls > self.settings.max_tool_calls:
            return f"error: tool call limit ({self.settings.max_tool_calls}) reached", True
        problems = schema_problems(call.arguments, tool.parameters)
        if problems:
            return f"error: {call.name}: " + "; ".join(problems), True
        part = f"tool {call.name}"
        limit = f"{part} exceeded its timeout_s of {{timeout}}"
        try:
            out = await self._side.call(
                tool.call, dict(call.arguments), timeout=float(tool.timeout_s), limit=limit
            )
        except CallTimeout as exc:
            traj.abandoned_calls += int(exc.abandoned)
            return self._tool_failure(traj, failure_of(exc, part, "call"))
        except UserCodeError as exc:  # SystemExit & co.: a broken tool, not the model's mistake
            raise failure_of(exc, part, "call") from exc
        except Exception as exc:
            return self._tool_failure(traj, failure_of(exc, part, "call"))
        problem = text_problem(out)
        if problem is not None:
            return self._tool_failure(traj, Failure("bad_value", part, f"{part} {problem}"))
        return out, False

    # -- moving a trajectory along (on the caller's thread, under the lock) ----------------------
    def _handle_event(self, event: Event[_Traj]) -> None:
        what, traj, value = event.what, event.subject, event.value
        with self._lock:
            if what == "error":
                self._fail(
                    traj, failure_of(value, "rollout", "") if not isinstance(value, Failure) else value
                )
            elif what == "reset":
                assert traj.template is not None
                traj.conversation = list(value.messages)
                try:
                    prompt = traj.template.prompt_ids(traj.conversation)
                except Exception as exc:
                    self._fail(traj, self._template_failure(exc, "reset"))
                    return
                budget = self.max_prompt_length
                if budget is not None and len(prompt) > budget:
                    self._fail(
                        traj,
                        self._bad(
                            "reset",
                            f"returned a first observation of {len(prompt)} tokens, longer than the prompt "
                            f"budget (data.max_prompt_length={budget})",
                        ),
                    )
                    return
                traj.prompt_ids = prompt
                self._note_env(traj, value)
                self._next_turn(traj)
            elif what in ("step", "tools"):
                step: EnvStep = value
                if what == "step":
                    self._note_env(traj, step)
                if step.done and step.messages:  # no turn reads them: kept on the record
                    traj.final_messages = list(step.messages)
                if step.done or traj.turns >= self.settings.max_turns:
                    traj.truncated = not step.done
                    self._finish(traj, "stop" if step.done else "length")
                    return
                self._observe(traj, list(step.messages))

    def _fail(self, traj: _Traj, failure: Failure) -> None:
        traj.failure = failure
        self._finish(traj, "stop")

    def _template_failure(self, exc: Exception, call: str) -> Failure:
        """The chat template could not render what the environment or a tool gave."""
        out = failure_of(exc, "chat template", f"rendering the {self.env_part}'s {call} messages")
        out.kind = "bad_value"
        return out

    def _note_env(self, traj: _Traj, step: EnvStep) -> None:
        if step.reward is not None:
            traj.rewards.append(float(step.reward))
            traj.reward_positions.append(len(traj.response_ids) - 1)  # the turn just read (or -1)
        for k, v in step.info.items():
            if (isinstance(v, (int, float)) and not isinstance(v, bool)) or isinstance(v, bool):
                traj.env_info[k] = float(v)

    def _observe(self, traj: _Traj, messages: list[Message]) -> None:
        """Append the observation as the template's delta (mask 0), then ask for the next turn."""
        assert traj.template is not None
        try:
            delta = traj.template.delta_ids(traj.conversation, messages)
        except Exception as exc:
            self._fail(traj, self._template_failure(exc, "observation"))
            return
        if len(traj.response_ids) + len(delta) >= self.max_response_length:
            traj.truncated = True
            self._finish(traj, "length")
            return
        traj.conversation.extend(messages)
        version = traj.versions[-1] if traj.versions else self.inner.version
        traj.response_ids += delta
        traj.loss_mask += [0] * len(delta)
        traj.log_probs += [0.0] * len(delta)
        traj.versions += [version] * len(delta)
        self._next_turn(traj)

    def _next_turn(self, traj: _Traj) -> None:
        left = self.max_response_length - len(traj.response_ids)
        per_turn = self.settings.per_turn_max_tokens
        budget = left if per_turn is None else min(left, per_turn)
        if budget <= 0:
            traj.truncated = True
            self._finish(traj, "length")
            return
        req = traj.request
        seed = req.sampling.seed
        sampling = dataclasses.replace(
            req.sampling,
            n=1,
            max_new_tokens=budget,
            seed=None if seed is None else (seed * 1_000_003 + traj.index * 7_919 + traj.turns) % (2**31),
        )
        rid = f"{req.request_id}/{traj.index}#t{traj.turns}"
        turn = GenerationRequest(
            request_id=rid,
            prompt_ids=[*traj.prompt_ids, *traj.response_ids],
            sampling=sampling,
            data=req.data,
            multi_modal=req.multi_modal,
        )
        self._by_turn[rid] = traj
        self.inner.submit([turn])

    def _on_turn(self, s: Sample) -> None:
        with self._lock:
            traj = self._by_turn.pop(s.request_id, None)
            if traj is None:  # not ours (a caller of the inner backend)
                return
            ids = list(s.response_ids)
            traj.pending_spans.append((len(traj.response_ids), len(traj.response_ids) + len(ids)))
            traj.response_ids += ids
            traj.loss_mask += [1] * len(ids)
            traj.log_probs += list(s.rollout_log_probs)
            traj.versions += list(s.versions)
            traj.turns += 1
            stopped = bool(ids) and ids[-1] in self.stop_ids and s.finish_reason == "stop"
            text = self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
            traj.final_text = text
            if s.finish_reason == "abort":
                self._finish(traj, "abort")
                return
            if not stopped:  # the turn ran out of tokens: nothing can follow it
                traj.truncated = True
                self._finish(traj, "length")
                return
            traj.conversation.append({"role": "assistant", "content": text})
            calls = parse_tool_calls(text, self.settings.tool_call_format, traj.tools) if traj.tools else []
            if calls:
                if traj.turns >= self.settings.max_turns:
                    traj.truncated = True
                    self._finish(traj, "length")
                    return
                self._side.spawn("tools", traj, self._tools_step(traj, calls))
                return
            turn = AgentTurn(
                text=text,
                turn=traj.turns - 1,
                finish_reason=s.finish_reason,
                tool_calls=tuple(traj.pending_calls),
                tool_results=tuple(traj.pending_results),
                turn_tokens=tuple(  # one batch_decode call per turn (each id alone)
                    tuple(
                        self.tokenizer.batch_decode(
                            [[i] for i in traj.response_ids[a:b]], skip_special_tokens=False
                        )
                    )
                    for a, b in traj.pending_spans
                ),
            )
            spans = traj.pending_spans
            traj.pending_calls, traj.pending_results, traj.pending_spans = [], [], []
            self._side.spawn("step", traj, self._step(traj, turn, spans))

    async def _tools_step(self, traj: _Traj, calls: list[ToolCall]) -> EnvStep:
        return EnvStep(messages=await self._run_tools(traj, calls))

    def _finish(self, traj: _Traj, finish_reason: str) -> None:
        req = traj.request
        prompt = traj.prompt_ids or list(req.prompt_ids)
        failure = traj.failure
        model_tokens = sum(traj.loss_mask)
        dense = sum(r for _, r in traj.token_rewards)
        sample = Sample(
            request_id=req.request_id,
            index=traj.index,
            prompt_ids=list(prompt),
            response_ids=traj.response_ids,
            rollout_log_probs=traj.log_probs,
            versions=traj.versions,
            finish_reason=finish_reason,
            data=dict(req.data),
            multi_modal=req.multi_modal,
            loss_mask=traj.loss_mask,
            agent={
                "turns": traj.turns,
                "tool_calls": traj.tool_calls,
                "tool_errors": traj.tool_errors,
                "malformed_calls": traj.malformed_calls,
                "reward": sum(traj.rewards) + dense if traj.rewards or traj.token_rewards else None,
                "turn_rewards": list(traj.rewards),
                "turn_reward_positions": list(traj.reward_positions),
                "token_rewards": [[p, r] for p, r in traj.token_rewards],
                "env_time_s": traj.env_time_s,
                "truncated": traj.truncated,
                "model_tokens": model_tokens,
                "env_tokens": len(traj.response_ids) - model_tokens,
                "final_text": traj.final_text,
                "error": None if failure is None else failure.message,
                "failure": None if failure is None else failure.record(),
                "tool_failures": list(traj.tool_failures),
                "abandoned_calls": traj.abandoned_calls,
                "observations_truncated": traj.observations_truncated,
                "final_messages": list(traj.final_messages),
                "env_info": dict(traj.env_info),
            },
        )
        self._finished.put(traj.key, [sample])


def agent_metrics(records: Sequence[Mapping[str, Any] | None]) -> dict[str, float]:
    """``agent/*`` metrics of a batch's trajectory records (:attr:`Sample.agent`; None: single-turn)."""
    recs = [r for r in records if r is not None]
    if not recs:
        return {}
    n = len(recs)

    def mean(key: str) -> float:
        return sum(float(r[key]) for r in recs) / n

    out = {
        "agent/turns/mean": mean("turns"),
        "agent/turns/max": float(max(r["turns"] for r in recs)),
        "agent/tool_calls/mean": mean("tool_calls"),
        "agent/tool_errors/mean": mean("tool_errors"),
        "agent/malformed_calls/mean": mean("malformed_calls"),
        "agent/env_time_s/mean": mean("env_time_s"),
        "agent/truncated_frac": sum(1.0 for r in recs if r["truncated"]) / n,
        "agent/env_failed": float(sum(1 for r in recs if r.get("error"))),
        "agent/abandoned_calls": float(sum(r.get("abandoned_calls", 0) for r in recs)),
        "agent/observations_truncated": float(sum(r.get("observations_truncated", 0) for r in recs)),
        "agent/tool_failures": float(sum(len(r.get("tool_failures", ())) for r in recs)),
        "agent/model_tokens/mean": mean("model_tokens"),
        "agent/env_tokens/mean": mean("env_tokens"),
    }
    gw = [r["gateway"] for r in recs if r.get("gateway")]
    if gw:  # episodes through the gateway (rlzoo.gateway): counts per episode, summed over the batch
        out["agent/gateway/calls"] = float(sum(g["calls"] for g in gw))
        out["agent/gateway/samples_per_episode"] = len(gw) / max(1, sum(1 for g in gw if g["segment"] == 0))
        out["agent/gateway/refused_calls"] = float(sum(g["refused_calls"] for g in gw))
        out["agent/gateway/late_calls"] = float(sum(g["late_calls"] for g in gw))
        reasons = sorted({k for g in gw for k in g["splits"]})
        out["agent/gateway/splits"] = float(sum(sum(g["splits"].values()) for g in gw))
        for why in reasons:
            out[f"agent/gateway/splits/{why}"] = float(sum(g["splits"].get(why, 0) for g in gw))
    keys = sorted({k for r in recs for k in r.get("env_info", {})})
    for k in keys:
        vals = [r["env_info"][k] for r in recs if k in r.get("env_info", {})]
        out[f"agent/env/{k}"] = sum(vals) / len(vals)
    return out
