"""``GatewayRollout``: a user's agent plays each episode through an OpenAI-compatible gateway.

It is a :class:`~rlzoo.kernel.protocols.RolloutBackend` composed over the engine (as
:class:`~rlzoo.agents.rollout.MultiTurnRollout` is), so every batch source uses it unchanged:
``submit`` starts one episode per request and choice (``rollout.n`` episodes of the same row), the
agent runs on a :class:`~rlzoo.agents.loop.SideLoop` under ``rollout.gateway.agent_timeout_s``,
and its calls arrive on the HTTP server's threads. A call is rendered to prompt ids, handed to the
caller's thread (the one pumping ``stream`` / ``generate``) which submits it to the engine, and
answered when the engine's sample comes back. A weight push pauses the engine, never a call: the
call waits, and with partial rollout each token keeps the version that sampled it.

Rendering never re-tokenizes what the model sampled: when a call's messages are the messages of an
earlier call plus the reply the gateway gave (the agent kept its history), its prompt ids are that
call's prompt ids, its sampled ids, then the chat template's delta for the new messages (tool
results, a user turn; :meth:`~rlzoo.agents.chat.ChatTemplate.delta_ids`). Any other call is
rendered whole, and says why (``history_edited``, ``unclosed_turn``, ``choice``). When the episode
ends its calls become samples (:func:`rlzoo.gateway.episodes.episode_samples`).

With an environment (``rollout.environment`` beside ``rollout.agent``) the environment judges each
episode as the native multi-turn path would have: ``reset`` on the row, then, when the last call
ended on its stop token without tool calls, one ``step`` on the episode's calls (their tokens, tool
calls and the tool results the agent sent back); its reward, info and per-token rewards
(``EnvStep.token_rewards``, each on the token of the call it names) are the episode's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from rlzoo.agents.boundary import Failure, failure_of, step_problem
from rlzoo.agents.chat import ChatTemplate
from rlzoo.agents.loop import Event, Finished, OverEngine, Pump, SideLoop
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.gateway.episodes import Call, SplitRefused, episode_samples
from rlzoo.gateway.openai_api import (
    ApiError,
    Choice,
    EventStream,
    SchemaTool,
    chat_chunks,
    chat_reply,
    completion_chunks,
    completion_reply,
    models_reply,
    parse_chat,
    parse_completion,
    read_tool_calls,
)
from rlzoo.gateway.server import GatewayServer
from rlzoo.gateway.settings import GatewaySettings
from rlzoo.kernel.protocols import (
    Agent,
    AgentResult,
    AgentTurn,
    ClientConfig,
    Environment,
    EnvStep,
    GenerationRequest,
    Message,
    RolloutBackend,
    Sample,
)

__all__ = ["GatewayRollout", "call_number", "call_request_id", "jsonable"]

_TIMEOUT = "rollout.gateway.agent_timeout_s"
_KEPT = 1024  # renderings kept per set of tools (ChatTemplate.memo)
_KEPT_TEMPLATES = 16  # sets of tools whose template is kept


def call_request_id(request_id: str, episode: int, call: int, k: int) -> str:
    """The engine request id of completion ``k`` of model call ``call`` (0-based, in the order the agent
    made them) in episode ``episode`` of the rollout request ``request_id``."""
    return f"{request_id}/{episode}#g{call}.{k}"


def call_number(engine_request_id: str) -> int:
    """The model call a :func:`call_request_id` names (its ``call``)."""
    return int(engine_request_id.rsplit("#g", 1)[1].split(".")[0])


def jsonable(value: Any) -> Any:
    """``value`` as JSON values (numpy arrays and scalars, tuples; anything else as its text)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return jsonable(tolist())
    return str(value)


@dataclass
class _Turn:
    """A served choice another call may extend: the messages it answered and its reply."""

    messages: list[Message]  # the request's messages (normalized)
    reply: Message  # the assistant message the agent got back (normalized)
    raw: list[Message]  # the conversation as the template renders it (assistant turns as raw text)
    call: Call
    tools: tuple[SchemaTool, ...]


@dataclass
class _Pending:
    request: GenerationRequest
    future: concurrent.futures.Future[Sample] = field(default_factory=concurrent.futures.Future)


@dataclass
class _Episode:
    id: str
    request: GenerationRequest
    index: int
    row: dict[str, Any]
    calls: list[Call] = field(default_factory=list)
    turns: list[_Turn] = field(default_factory=list)
    done: bool = False
    aborted: bool = False
    refused_calls: int = 0
    call_no: int = 0
    judged: EnvStep | None = None  # the judging environment's verdict (reset's reward and info folded in)
    started: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def key(self) -> tuple[str, int]:
        return (self.request.request_id, self.index)


def _norm_reply(content: str | None, calls: Sequence[Any]) -> Message:
    out: Message = {"role": "assistant", "content": content or ""}
    if calls:
        out["tool_calls"] = [{"name": c.name, "arguments": dict(c.arguments)} for c in calls]
    return out


def _same(a: Message, b: Message) -> bool:
    """Whether an agent's message is the one the gateway saw (tool call ids and names aside)."""
    if a.get("role") != b.get("role") or (a.get("content") or "") != (b.get("content") or ""):
        return False
    ca = [(c["name"], c["arguments"]) for c in a.get("tool_calls") or []]
    cb = [(c["name"], c["arguments"]) for c in b.get("tool_calls") or []]
    return ca == cb


class GatewayRollout(OverEngine):
    """A :class:`~rlzoo.kernel.protocols.RolloutBackend` whose episodes are played by ``make_agent``'s
    agents through the gateway (module docstring).

    Args:
        inner: the engine (weights and pauses go to it; :meth:`shutdown` shuts it down too).
        make_agent: builds one agent per episode (the selected part's factory, bound).
        tokenizer: the model's tokenizer (chat template; decoding replies).
        settings: ``rollout.gateway``.
        multi_turn: ``rollout.multi_turn`` (per-turn token budget, tool call format, calls per episode).
        max_response_length: the response budget of a trajectory (every token after its prompt).
        max_prompt_length: the prompt budget of an episode's first call.
        stop_ids: ids that end a model turn (EOS).
        agent_name: the agent's part name (failures name it).
        template_kwargs: extra ``apply_chat_template`` arguments.
        make_env: builds the environment that judges each episode (module docstring); None: the
            agent's reward, else the recipe's scorer on its final answer.
        env_name: the judging environment's part name (failures name it).
    """

    def __init__(
        self,
        inner: RolloutBackend,
        make_agent: Callable[[], Agent],
        tokenizer: Any,
        settings: GatewaySettings,
        multi_turn: MultiTurnSettings,
        *,
        max_response_length: int,
        max_prompt_length: int,
        stop_ids: Sequence[int],
        agent_name: str = "agent",
        template_kwargs: Mapping[str, Any] | None = None,
        make_env: Callable[[], Environment] | None = None,
        env_name: str | None = None,
    ) -> None:
        self.inner = inner
        self.make_agent = make_agent
        self.tokenizer = tokenizer
        self.settings = settings
        self.multi_turn = multi_turn
        self.max_response_length = int(max_response_length)
        self.max_prompt_length = int(max_prompt_length)
        self.stop_ids = tuple(int(t) for t in stop_ids)
        self.part = f"agent {agent_name}"
        self.template_kwargs = dict(template_kwargs or {})
        self.make_env = make_env
        self.env_part = f"environment {env_name}" if env_name else "environment"
        self.key = secrets.token_urlsafe(24)
        self._lock = threading.RLock()
        self._tok_lock = threading.Lock()  # one tokenizer, many handler threads
        self._templates: dict[str, ChatTemplate] = {}  # by tools (under _tok_lock)
        self._episodes: dict[str, _Episode] = {}
        self._by_call: dict[str, _Pending] = {}  # engine request id -> waiting call
        self._late_calls = 0  # calls after their episode ended, not yet on a record
        self._side: SideLoop[Any] = SideLoop(settings.concurrency, name="rlzoo-gateway-agents")
        self._pump = Pump(
            self._side,
            inner,
            engine_busy=self._on_engine,
            on_event=self._handle_event,
            on_sample=self._on_sample,
        )
        self._finished = Finished(self._lock, self._pump)
        self.server = GatewayServer(
            self,
            self.key,
            host=settings.host,
            max_bytes=settings.max_request_bytes,
            idle_timeout_s=settings.idle_timeout_s,
        )

    # ------------------------------------------------------------------------------------------
    # RolloutBackend
    # ------------------------------------------------------------------------------------------
    def client(self, episode: str) -> ClientConfig:
        base = f"http://{self.server.url_host}:{self.server.port}/e/{episode}/v1"
        return ClientConfig(base_url=base, api_key=self.key, model=self.settings.model_name)

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self._lock:
            for req in requests:
                for i in range(req.sampling.n):
                    ep = _Episode(id=secrets.token_hex(8), request=req, index=i, row=jsonable(dict(req.data)))
                    self._episodes[ep.id] = ep
                    self._finished.start()
                    self._side.spawn("episode", ep, self._run(ep))

    def shutdown(self) -> None:
        self.server.close()
        with self._lock:
            for p in self._by_call.values():
                p.future.cancel()
        self._side.close()
        self.inner.shutdown()

    # ------------------------------------------------------------------------------------------
    # the caller's thread: episodes finished, calls submitted, samples back
    # ------------------------------------------------------------------------------------------
    def _on_engine(self) -> bool:
        with self._lock:
            return bool(self._by_call)

    def _handle_event(self, event: Event[Any]) -> None:
        what, subject, value = event.what, event.subject, event.value
        if what == "call":  # a handler's request: onto the engine, from this thread
            pending: _Pending = value
            if pending.future.cancelled():
                return
            with self._lock:
                self._by_call[pending.request.request_id] = pending
            self.inner.submit([pending.request])
            return
        ep: _Episode = subject
        if what == "error":
            self._finish(
                ep, None, value if isinstance(value, Failure) else failure_of(value, self.part, "run")
            )
        else:
            self._finish(ep, value, None)

    def _on_sample(self, s: Sample) -> None:
        with self._lock:
            pending = self._by_call.pop(s.request_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_result(s)

    async def _run(self, ep: _Episode) -> AgentResult:
        limit = f"{self.part} exceeded {{timeout}} ({_TIMEOUT})"
        t = self.settings.agent_timeout_s
        agent = await self._side.call(
            self.make_agent, timeout=t, limit=f"{self.part} factory exceeded {{timeout}}"
        )
        if not isinstance(agent, Agent):
            raise Failure(
                "bad_value", self.part, f"{self.part}: the factory must return an Agent (run), got {agent!r}"
            )
        out = await self._side.call(agent.run, self.client(ep.id), ep.row, timeout=t, limit=limit)
        result = self._checked(out)
        if self.make_env is not None:
            ep.judged = await self._judge(ep)
        return result

    async def _env_call(self, call: str, fn: Callable[..., Any], *args: Any) -> Any:
        """The judging environment's ``call`` under ``env_timeout_s``; what it returned (an
        ``EnvStep`` checked at the boundary), or a :class:`Failure`."""
        limit = f"{self.env_part} {call} exceeded {{timeout}} (rollout.multi_turn.env_timeout_s)"
        try:
            out = await self._side.call(fn, *args, timeout=self.multi_turn.env_timeout_s, limit=limit)
        except Exception as exc:
            raise failure_of(exc, self.env_part, call) from exc
        if call != "factory":
            problem = step_problem(out, first=call == "reset", max_abs_reward=self.multi_turn.max_abs_reward)
            if problem is not None:
                raise Failure("bad_value", self.env_part, f"{self.env_part} {call} {problem}")
        return out

    async def _judge(self, ep: _Episode) -> EnvStep | None:
        """The environment's verdict on the episode (module docstring); each call's token rewards
        are set on it. None: no verdict (the last call was cut or made tool calls: the scorer judges,
        as the native path's trajectory that ends without a step)."""
        assert self.make_env is not None
        with ep.lock:
            calls = list(ep.calls)
        env: Environment = await self._env_call("factory", self.make_env)
        first: EnvStep = await self._env_call(
            "reset", env.reset, {**ep.request.data, "prompt_ids": list(ep.request.prompt_ids)}
        )
        if not calls or calls[-1].finish_reason != "stop" or calls[-1].parsed_calls:
            return first if first.reward is not None else None
        with self._tok_lock:
            tokens = tuple(
                tuple(self.tokenizer.batch_decode([[i] for i in c.response_ids], skip_special_tokens=False))
                for c in calls
            )
        turn = AgentTurn(
            text=calls[-1].text,
            turn=len(calls) - 1,
            finish_reason="stop",
            tool_calls=tuple(tc for c in calls[:-1] for tc in c.parsed_calls),
            tool_results=tuple(r for c in calls[:-1] for r in c.tool_results),
            turn_tokens=tokens,
        )
        out: EnvStep = await self._env_call("step", env.step, turn)
        if out.token_rewards is not None:
            want, got = [len(t) for t in tokens], [len(r) for r in out.token_rewards]
            if got != want:
                raise Failure(
                    "bad_value",
                    self.env_part,
                    f"{self.env_part} step returned token_rewards that must hold one list per turn of "
                    f"turn.turn_tokens with one reward per token: token counts {want}, got reward counts {got}",
                )
            for c, rs in zip(calls, out.token_rewards):
                c.token_rewards = [float(r) for r in rs]
        reward = (
            None
            if out.reward is None and first.reward is None
            else (out.reward or 0.0) + (first.reward or 0.0)
        )
        return dataclasses.replace(out, reward=reward, info={**first.info, **out.info})

    def _checked(self, out: Any) -> AgentResult:
        """The agent's result if usable, else a :class:`Failure` saying what is wrong."""
        if isinstance(out, Mapping):
            out = AgentResult(
                reward=out.get("reward"),
                final_answer=out.get("final_answer"),
                info=dict(out.get("info") or {}),
            )
        if not isinstance(out, AgentResult):
            raise Failure(
                "bad_value", self.part, f"{self.part} run returned {type(out).__name__}, not AgentResult"
            )
        r = out.reward
        if r is not None and (
            isinstance(r, bool)
            or not isinstance(r, Real)
            or not math.isfinite(float(r))
            or abs(float(r)) > self.multi_turn.max_abs_reward
        ):
            raise Failure(
                "bad_value",
                self.part,
                f"{self.part} returned reward {r!r}: it must be a finite number within "
                f"+-{self.multi_turn.max_abs_reward:g} (rollout.multi_turn.max_abs_reward), or None",
            )
        if out.final_answer is not None and not isinstance(out.final_answer, str):
            raise Failure(
                "bad_value",
                self.part,
                f"{self.part} returned final_answer {out.final_answer!r}, not text or None",
            )
        if not isinstance(out.info, Mapping):
            raise Failure("bad_value", self.part, f"{self.part} returned info {out.info!r}, not a mapping")
        return out

    def _finish(self, ep: _Episode, result: AgentResult | None, failure: Failure | None) -> None:
        with ep.lock:
            ep.done = True
            calls = list(ep.calls)
        if ep.aborted:  # the run stopped a call (a push without partial rollout): not the agent's failure
            failure = None
        with self._lock:
            self._episodes.pop(ep.id, None)
            late, self._late_calls = self._late_calls, 0
        verdict = ep.judged if result is not None else None
        given = {
            **(result.info if result is not None else {}),
            **(verdict.info if verdict is not None else {}),
        }
        info = {
            k: float(v) for k, v in given.items() if isinstance(v, (int, float)) and math.isfinite(float(v))
        }
        reward = None if result is None or result.reward is None else float(result.reward)
        if verdict is not None and verdict.reward is not None:  # the environment judges: its reward
            reward = float(verdict.reward)
        took = time.perf_counter() - ep.started

        def make(record: Mapping[str, Any] | None, refuse: bool) -> list[Sample]:
            return episode_samples(
                ep.request,
                ep.index,
                calls,
                max_response_length=self.max_response_length,
                reward=reward,
                final_text=None if result is None else result.final_answer,
                failure=record,
                info=info,
                refuse_splits=refuse,
                late_calls=late,
                refused_calls=ep.refused_calls,
                agent_time_s=took,
            )

        try:
            samples = make(None if failure is None else failure.record(), self.settings.split == "refuse")
        except SplitRefused as exc:
            samples = make(Failure("bad_value", self.part, f"{self.part}: {exc}").record(), False)
        if ep.aborted:
            for s in samples:
                s.finish_reason = "abort"
        with self._lock:
            self._finished.put(ep.key, samples)

    # ------------------------------------------------------------------------------------------
    # the handler threads (App)
    # ------------------------------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        return models_reply(self.settings.model_name)

    def _episode(self, episode: str) -> _Episode:
        with self._lock:
            ep = self._episodes.get(episode)
        if ep is None:
            with self._lock:
                self._late_calls += 1
            raise ApiError(
                409,
                f"episode {episode!r} has ended (or never was): a call after the agent's episode ended is "
                "refused and counted (agent/gateway/late_calls)",
                code="episode_ended",
            )
        return ep

    def _refuse(self, ep: _Episode, exc: ApiError) -> ApiError:
        with ep.lock:
            ep.refused_calls += 1
        return exc

    def _check_model(self, ep: _Episode, model: str) -> None:
        if model != self.settings.model_name:
            raise self._refuse(
                ep,
                ApiError(
                    404,
                    f"the model {model!r} does not exist: this gateway serves {self.settings.model_name!r} "
                    "(rollout.gateway.model_name)",
                    param="model",
                    code="model_not_found",
                ),
            )

    def chat(self, episode: str, body: Any) -> dict[str, Any] | EventStream:
        ep = self._episode(episode)
        try:
            req = parse_chat(body, max_tokens=self.settings.max_tokens, max_n=self.settings.max_n)
        except ApiError as exc:
            raise self._refuse(ep, exc) from None
        self._check_model(ep, req.model)
        tools = tuple(req.tools)
        with self._tok_lock:
            try:
                prompt, raw, why = self._render(ep, req.messages, tools)
            except ApiError as exc:
                raise self._refuse(ep, exc) from None
            except Exception as exc:  # the template refused the messages
                raise self._refuse(
                    ep,
                    ApiError(
                        400, f"the chat template cannot render these messages: {type(exc).__name__}: {exc}"
                    ),
                ) from None
        samples = self._sample(ep, prompt, why, req.sampling)
        fmt = self.multi_turn.tool_call_format
        choices: list[Choice] = []
        for _k, (s, call) in enumerate(samples):
            text = call.text
            content: str | None = text
            parsed: list[Any] = []
            if tools and req.tool_choice != "none" and s.finish_reason == "stop":
                content, parsed = read_tool_calls(text, fmt, tools)
            good = [c for c in parsed if c.malformed is None]
            call.tool_calls = len(good)
            call.parsed_calls = tuple(good)
            call.malformed_calls = len(parsed) - len(good)
            finish = "tool_calls" if good else ("stop" if s.finish_reason == "stop" else "length")
            choice = self._choice(s, text, finish, good, content, req.sampling.logprobs)
            if req.streaming.on and content == text:
                choice.pieces = self._pieces(s, text)
            choices.append(choice)
            reply = _norm_reply(content, good)
            with ep.lock:
                if not ep.done:
                    ep.turns.append(
                        _Turn(
                            messages=list(req.messages),
                            reply=reply,
                            raw=[*raw, {"role": "assistant", "content": text}],
                            call=call,
                            tools=tools,
                        )
                    )
        reply = chat_reply(self.settings.model_name, choices, len(prompt), req.sampling.logprobs)
        if req.streaming.on:
            return chat_chunks(reply, choices, req.streaming.include_usage)
        return reply

    def completion(self, episode: str, body: Any) -> dict[str, Any] | EventStream:
        ep = self._episode(episode)
        try:
            req = parse_completion(body, max_tokens=self.settings.max_tokens, max_n=self.settings.max_n)
        except ApiError as exc:
            raise self._refuse(ep, exc) from None
        self._check_model(ep, req.model)
        if isinstance(req.prompt, str):
            with self._tok_lock:
                prompt = list(self.tokenizer(req.prompt, add_special_tokens=False)["input_ids"])
            why = "text_prompt"
        else:
            vocab = len(self.tokenizer)
            if max(req.prompt) >= vocab:
                raise self._refuse(
                    ep,
                    ApiError(
                        400,
                        f"prompt token id {max(req.prompt)} is past the vocabulary ({vocab})",
                        param="prompt",
                    ),
                )
            prompt, why = list(req.prompt), "token_prompt"
        samples = self._sample(ep, prompt, why, req.sampling)
        choices = [
            self._choice(
                s,
                call.text,
                "stop" if s.finish_reason == "stop" else "length",
                [],
                call.text,
                req.sampling.logprobs,
            )
            for s, call in samples
        ]
        if req.streaming.on:
            for (s, _), choice in zip(samples, choices):
                choice.pieces = self._pieces(s, choice.text)
        reply = completion_reply(self.settings.model_name, choices, len(prompt), req.sampling.logprobs)
        if req.streaming.on:
            return completion_chunks(reply, choices, req.streaming.include_usage)
        return reply

    def _choice(
        self, s: Sample, text: str, finish: str, calls: list[Any], content: str | None, logprobs: bool
    ) -> Choice:
        tokens: list[str] = []
        if logprobs:
            with self._tok_lock:
                tokens = list(
                    self.tokenizer.batch_decode([[i] for i in s.response_ids], skip_special_tokens=False)
                )
        return Choice(
            text=text,
            finish_reason=finish,
            tool_calls=calls,
            content=content,
            tokens=tokens,
            log_probs=list(s.rollout_log_probs),
            completion_tokens=len(s.response_ids),
        )

    def _pieces(self, s: Sample, text: str) -> list[str]:
        """``text`` (the decoded reply) cut where its tokens end, for a streamed reply: piece k is what
        token k adds to the text decoded so far (a token that ends inside a character adds nothing
        until the one that completes it). Empty when the cuts do not rebuild ``text`` exactly (the
        reply then streams as one piece)."""
        pieces, done = [], ""
        with self._tok_lock:
            for j in range(1, len(s.response_ids) + 1):
                now = self.tokenizer.decode(s.response_ids[:j], skip_special_tokens=False)
                if text.startswith(now):
                    if len(now) > len(done):
                        pieces.append(now[len(done) :])
                        done = now
                elif len(now) > len(text):  # past the reply (its stop token, a stop string's end)
                    break
        return pieces if done == text else []

    def _template(self, tools: Sequence[SchemaTool]) -> ChatTemplate:
        """The chat template for calls that declare ``tools``: one per set of tools, kept with its
        renderings (``rollout.n`` episodes of a row open with the same messages; call under the
        tokenizer lock)."""
        key = repr(list(tools))
        template = self._templates.get(key)
        if template is None:
            template = ChatTemplate(self.tokenizer, tools, self.stop_ids, self.template_kwargs, memo=_KEPT)
            self._templates[key] = template
            if len(self._templates) > _KEPT_TEMPLATES:
                self._templates.pop(next(iter(self._templates)))
        return template

    def _to_template(self, messages: Sequence[Message]) -> list[Message]:
        """The agent's messages as the template renders them: an assistant's tool calls written in the
        model's convention, a tool result with the name of the call it answers."""
        names: dict[str, str] = {}
        out: list[Message] = []
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                text = m.get("content") or ""
                for c in m["tool_calls"]:
                    names[c["id"]] = c["name"]
                    out_call = self._write_call(c["name"], c["arguments"])
                    text = f"{text}\n{out_call}".strip() if text else out_call
                out.append({"role": "assistant", "content": text})
            elif m["role"] == "tool":
                name = m.get("name") or names.get(m.get("tool_call_id") or "", "")
                out.append({"role": "tool", "content": m["content"], **({"name": name} if name else {})})
            else:
                out.append({"role": m["role"], "content": m["content"]})
        return out

    def _write_call(self, name: str, arguments: Any) -> str:
        if self.multi_turn.tool_call_format == "plain":
            vals = list(arguments.values()) if isinstance(arguments, Mapping) else [arguments]
            return f"{name} {vals[0]}" if vals else name
        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

    def _render(
        self, ep: _Episode, messages: list[Message], tools: tuple[SchemaTool, ...]
    ) -> tuple[list[int], list[Message], str | None]:
        """The call's prompt ids, its conversation as the template renders it, and why it was
        rendered whole (None: as the extension of an earlier call's ids)."""
        with ep.lock:
            turns = list(ep.turns)
        why = "first" if not turns else "history_edited"
        for t in reversed(turns):
            n = len(t.messages)
            if len(messages) <= n + 1 or not all(_same(a, b) for a, b in zip(messages[:n], t.messages)):
                continue
            if not _same(messages[n], t.reply):
                continue
            if t.call.finish_reason != "stop" or t.tools != tools:
                why = "unclosed_turn" if t.call.finish_reason != "stop" else "tools_changed"
                break
            new = self._to_template(messages[n + 1 :])
            delta = self._template(tools).delta_ids(t.raw, new)
            with ep.lock:  # what the agent's tools answered, as a judging environment reads it
                t.call.tool_results = tuple(m["content"] for m in new if m["role"] == "tool")
            return [*t.call.prompt_ids, *t.call.response_ids, *delta], [*t.raw, *new], None
        raw = self._to_template(messages)
        return self._template(tools).prompt_ids(raw), raw, why

    def _budget(self, ep: _Episode, prompt: list[int], asked: int | None) -> int:
        """Tokens this call may sample: what the request asked, the per-turn bound, and what is left
        of the response budget of the trajectory it extends (or of a new one)."""
        with ep.lock:
            calls = list(ep.calls)
        root, best = None, -1
        roots: dict[int, int] = {}  # call index -> its chain's prompt length
        for i, c in enumerate(calls):  # the chains, by ids (episodes.py's rule)
            roots[i] = len(c.prompt_ids)
            for j in range(i):
                size = len(calls[j].prompt_ids) + len(calls[j].response_ids)
                if (
                    c.prompt_ids[:size] == [*calls[j].prompt_ids, *calls[j].response_ids]
                    and len(c.prompt_ids) >= size
                ):
                    roots[i] = roots[j]
        for i, c in enumerate(calls):
            full = [*c.prompt_ids, *c.response_ids]
            if len(full) > best and len(prompt) >= len(full) and prompt[: len(full)] == full:
                root, best = roots[i], len(full)
        limit = self.max_prompt_length + self.max_response_length
        left = limit - len(prompt)
        if root is not None and self.max_response_length - (len(prompt) - root) > 0:
            left = min(left, self.max_response_length - (len(prompt) - root))
        elif root is None:
            left = min(left, self.max_response_length)
        per_turn = self.multi_turn.per_turn_max_tokens
        if per_turn is not None:
            left = min(left, per_turn)
        if asked is not None:
            left = min(left, asked)
        if left <= 0 or (root is None and len(prompt) > limit):
            raise ApiError(
                400,
                f"this call's prompt is {len(prompt)} tokens: no room is left to sample (data.max_prompt_length="
                f"{self.max_prompt_length}, data.max_response_length={self.max_response_length})",
                param="messages",
                code="context_length_exceeded",
            )
        return left

    def _sample(self, ep: _Episode, prompt: list[int], why: str | None, sp: Any) -> list[tuple[Sample, Call]]:
        """Sample ``sp.n`` choices of ``prompt`` on the engine (from the caller's thread) and record them."""
        with ep.lock:
            if ep.call_no >= self.multi_turn.max_turns:
                ep.refused_calls += 1
                raise ApiError(
                    429,
                    f"this episode made {ep.call_no} calls, the most rollout.multi_turn.max_turns allows",
                    type="rate_limit_error",
                    code="episode_call_limit",
                )
            no = ep.call_no
            ep.call_no += 1
        try:
            budget = self._budget(ep, prompt, sp.max_tokens)
        except ApiError as exc:
            raise self._refuse(ep, exc) from None
        base = ep.request.sampling
        pendings = []
        for k in range(sp.n):
            seed = (
                None
                if base.seed is None
                else (base.seed * 1_000_003 + ep.index * 7_919 + no * 31 + k) % (2**31)
            )
            sampling = dataclasses.replace(base, n=1, max_new_tokens=budget, seed=seed)
            rid = call_request_id(ep.request.request_id, ep.index, no, k)
            p = _Pending(GenerationRequest(rid, list(prompt), sampling, data=ep.request.data))
            pendings.append(p)
            self._side.post("call", ep, p)  # to the caller's thread, which submits it
        out: list[tuple[Sample, Call]] = []
        for k, p in enumerate(pendings):
            wait = self.settings.agent_timeout_s
            try:
                s = p.future.result(timeout=wait)
            except concurrent.futures.CancelledError:
                raise ApiError(
                    503, "the run stopped before this call was sampled", type="server_error"
                ) from None
            except concurrent.futures.TimeoutError:  # the engine (or the whole process) did not get to it
                raise ApiError(
                    503,
                    f"the engine did not sample this call within {wait:g} s ({_TIMEOUT}); the episode "
                    "has run past its time too",
                    type="server_error",
                    code="engine_timeout",
                ) from None
            ids = list(s.response_ids)
            stopped = bool(ids) and ids[-1] in self.stop_ids and s.finish_reason == "stop"
            ids, lps, vers, finish = ids, list(s.rollout_log_probs), list(s.versions), s.finish_reason
            with self._tok_lock:
                text = self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
            for stop in sp.stop:  # a stop string: the ids up to the token that completes it
                at = text.find(stop)
                if at >= 0:
                    with self._tok_lock:
                        cut = next(
                            j
                            for j in range(1, len(ids) + 1)
                            if stop in self.tokenizer.decode(ids[:j], skip_special_tokens=False)
                        )
                        ids, lps, vers, finish = ids[:cut], lps[:cut], vers[:cut], "stop_string"
                        text = text[:at]
                    break
            call = Call(
                prompt_ids=list(prompt),
                response_ids=ids,
                log_probs=lps,
                versions=vers,
                finish_reason=finish,
                why_fresh=(why if k == 0 else "choice"),
                text=text,
            )
            with ep.lock:
                if s.finish_reason == "abort":
                    ep.aborted = True
                if not ep.done:
                    ep.calls.append(call)
            if s.finish_reason == "abort":
                raise ApiError(
                    503,
                    "the run stopped this call (a weight sync without partial rollout)",
                    type="server_error",
                )
            view = dataclasses.replace(s, response_ids=ids, rollout_log_probs=lps, versions=vers)
            view.finish_reason = "stop" if finish in ("stop", "stop_string") else "length"
            out.append((view, call))
        return out
