"""The OpenAI wire format: requests read and checked, replies and errors written.

Only what the gateway serves: ``POST /v1/chat/completions`` (messages, tools, tool_choice, n,
temperature, top_p, max_tokens / max_completion_tokens, stop, logprobs, seed, stream,
stream_options.include_usage), ``POST /v1/completions`` and ``GET /v1/models``. A streamed reply
(:func:`chat_chunks`, :func:`completion_chunks`) is the same reply as server-sent events: OpenAI's
``chat.completion.chunk`` / ``text_completion`` chunks, then ``data: [DONE]``. A request the gateway cannot serve is an
:class:`ApiError` whose body is OpenAI's error object (``{"error": {"message", "type", "param",
"code"}}``), so an SDK raises its usual exception with the message.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from rlzoo.agents.parsing import parse_tool_calls
from rlzoo.kernel.protocols import Message, ToolCall

__all__ = [
    "ApiError",
    "ChatRequest",
    "CompletionRequest",
    "EventStream",
    "SchemaTool",
    "chat_chunks",
    "chat_reply",
    "completion_chunks",
    "completion_reply",
    "models_reply",
    "parse_chat",
    "parse_completion",
    "read_tool_calls",
]

ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """A request the gateway refuses, with its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class SchemaTool:
    """A tool the agent declared in ``tools``: its schema only (the agent runs it, not the gateway)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    timeout_s: float = 1.0

    def call(self, arguments: Mapping[str, Any]) -> str:
        raise RuntimeError("the agent runs its own tools; the gateway only renders their schemas")


@dataclass
class Sampling:
    """What one request asks of the sampler (the run's rollout settings decide temperature and
    top_p: the trainer's log-probs assume them; the agent's are checked and recorded)."""

    n: int = 1
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None


@dataclass(frozen=True)
class Streaming:
    """How a reply is written: as one JSON object, or (``on``) as server-sent event chunks, the last
    one with the usage when ``include_usage``."""

    on: bool = False
    include_usage: bool = False


@dataclass
class ChatRequest:
    model: str
    messages: list[Message]
    tools: list[SchemaTool] = field(default_factory=list)
    tool_choice: Any = "auto"
    sampling: Sampling = field(default_factory=Sampling)
    streaming: Streaming = Streaming()


@dataclass
class CompletionRequest:
    model: str
    prompt: str | list[int]
    sampling: Sampling = field(default_factory=Sampling)
    streaming: Streaming = Streaming()


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if (
        isinstance(v, bool)
        or not isinstance(v, Real)
        or not math.isfinite(float(v))
        or not lo <= float(v) <= hi
    ):
        raise _bad(f"{key} must be a number in [{lo:g}, {hi:g}], got {v!r}", key)
    return float(v)


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(f"{key} must be an integer in [{lo}, {hi}], got {v!r}", key)
    return v


def _streaming(body: Mapping[str, Any]) -> Streaming:
    on = body.get("stream")
    if on is None:
        on = False
    if not isinstance(on, bool):
        raise _bad(f"stream must be a boolean, got {on!r}", "stream")
    opts = body.get("stream_options")
    if opts is None:
        return Streaming(on)
    if not on:
        raise _bad("stream_options is only allowed when stream is true", "stream_options")
    usage = opts.get("include_usage", False) if isinstance(opts, Mapping) else None
    if not isinstance(usage, bool):
        raise _bad(f"stream_options must be {{include_usage: boolean}}, got {opts!r}"[:300], "stream_options")
    return Streaming(on, usage)


def _sampling(body: Mapping[str, Any], max_tokens: int, max_n: int) -> Sampling:
    a = _int(body, "max_tokens", 1, max_tokens)
    b = _int(body, "max_completion_tokens", 1, max_tokens)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop):
        stops = tuple(stop)
    else:
        raise _bad(f"stop must be a string or a list of at most 4 non-empty strings, got {stop!r}", "stop")
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, (bool, int)) or logprobs is None:
        raise _bad(f"logprobs must be a boolean, got {logprobs!r}", "logprobs")
    return Sampling(
        n=_int(body, "n", 1, max_n) or 1,
        max_tokens=b if b is not None else a,
        stop=stops,
        logprobs=bool(logprobs),
        seed=_int(body, "seed", -(2**63), 2**63 - 1),
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
    )


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required (a string): GET /v1/models lists the one served", "model")
    return model


def _content(m: Mapping[str, Any], i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if not isinstance(p, Mapping) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise _bad(f"messages[{i}].content: only text parts are served, got {p!r}"[:300], "messages")
            parts.append(p["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def _message(m: Any, i: int) -> Message:
    if not isinstance(m, Mapping):
        raise _bad(f"messages[{i}] must be an object", "messages")
    role = m.get("role")
    if role not in ROLES:
        raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", "messages")
    out: Message = {"role": "system" if role == "developer" else role, "content": _content(m, i)}
    calls = m.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list):
            raise _bad(f"messages[{i}].tool_calls must be a list", "messages")
        norm = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise _bad(f"messages[{i}].tool_calls[{j}] needs function.name", "messages")
            args = fn.get("arguments", "{}")
            try:
                parsed = json.loads(args) if isinstance(args, str) else args
            except ValueError:
                parsed = args
            norm.append({"id": str(c.get("id", "")), "name": fn["name"], "arguments": parsed})
        out["tool_calls"] = norm
    if role == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
    elif isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def _tools(body: Mapping[str, Any]) -> list[SchemaTool]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("tools must be a list of {type: function, function: {name, parameters}}", "tools")
    out: list[SchemaTool] = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) and t.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise _bad(
                f"tools[{i}] must be {{type: 'function', function: {{name, description, parameters}}}} with a "
                f"name without spaces, got {json.dumps(t)[:200]}",
                "tools",
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})  # type: ignore[union-attr]
        if not isinstance(params, Mapping):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        desc = fn.get("description", "")  # type: ignore[union-attr]
        out.append(SchemaTool(name=name, description=str(desc or ""), parameters=dict(params)))
    if len({t.name for t in out}) != len(out):
        raise _bad("tools: two tools share a name", "tools")
    return out


def parse_chat(body: Any, *, max_tokens: int, max_n: int) -> ChatRequest:
    """A chat completions request, checked (an :class:`ApiError` says what is wrong)."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    msgs = [_message(m, i) for i, m in enumerate(messages)]
    tools = _tools(body)
    choice = body.get("tool_choice", "auto" if tools else "none")
    if not (
        choice in ("auto", "none", "required")
        or (isinstance(choice, Mapping) and isinstance((choice.get("function") or {}).get("name"), str))
    ):
        raise _bad(
            f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}", "tool_choice"
        )
    return ChatRequest(
        model=_model(body),
        messages=msgs,
        tools=tools,
        tool_choice=choice,
        sampling=_sampling(body, max_tokens, max_n),
        streaming=_streaming(body),
    )


def parse_completion(body: Any, *, max_tokens: int, max_n: int) -> CompletionRequest:
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if not (
        (isinstance(prompt, str) and prompt)
        or (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
        )
    ):
        raise _bad("prompt must be a non-empty string or a list of token ids (one prompt)", "prompt")
    return CompletionRequest(
        model=_model(body),
        prompt=prompt,
        sampling=_sampling(body, max_tokens, max_n),
        streaming=_streaming(body),
    )


def read_tool_calls(text: str, fmt: str, tools: Sequence[SchemaTool]) -> tuple[str | None, list[ToolCall]]:
    """The reply's content and its tool calls, read with the template's convention (``fmt``). A
    call that cannot be read stays in the content (it is counted as malformed by the caller)."""
    if not tools:
        return text, []
    calls = parse_tool_calls(text, fmt, {t.name: t for t in tools})
    good = [c for c in calls if c.malformed is None and c.name in {t.name for t in tools}]
    if not good:
        return text, calls
    content = text
    for c in good:
        content = content.replace(c.raw, "")
    content = content.strip()
    return (content or None), calls


def _logprobs(tokens: Sequence[str], lps: Sequence[float]) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": float(lp), "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(tokens, lps)
        ]
    }


@dataclass
class Choice:
    """One sampled choice, ready to write."""

    text: str
    finish_reason: str  # stop | length | tool_calls
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    tokens: list[str] = field(default_factory=list)  # decoded one by one (logprobs)
    log_probs: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    #: the content (chat) or text (completions) cut where its tokens end, for a streamed reply: the
    #: pieces join to exactly the content; empty: one piece
    pieces: list[str] = field(default_factory=list)


def chat_reply(model: str, choices: Sequence[Choice], prompt_tokens: int, logprobs: bool) -> dict[str, Any]:
    out = []
    for i, c in enumerate(choices):
        msg: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": t.name, "arguments": json.dumps(t.arguments)},
                }
                for t in c.tool_calls
            ]
        out.append(
            {
                "index": i,
                "message": msg,
                "finish_reason": c.finish_reason,
                "logprobs": _logprobs(c.tokens, c.log_probs) if logprobs else None,
            }
        )
    completion = sum(c.completion_tokens for c in choices)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def completion_reply(
    model: str, choices: Sequence[Choice], prompt_tokens: int, logprobs: bool
) -> dict[str, Any]:
    out = []
    for i, c in enumerate(choices):
        lp = None
        if logprobs:
            lp = {
                "tokens": list(c.tokens),
                "token_logprobs": [float(x) for x in c.log_probs],
                "top_logprobs": None,
            }
        out.append({"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": lp})
    completion = sum(c.completion_tokens for c in choices)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def models_reply(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "rlzoo"}]}


@dataclass
class EventStream:
    """A streamed reply: its chunks, written as server-sent events and closed by ``data: [DONE]``.
    The engine gives a call's tokens when it finishes the call, so every chunk is ready at once."""

    chunks: list[dict[str, Any]]

    def body(self) -> bytes:
        events = [b"data: " + json.dumps(c).encode("utf-8") + b"\n\n" for c in self.chunks]
        return b"".join([*events, b"data: [DONE]\n\n"])


def _pieces(c: Choice, whole: str | None) -> list[str]:
    if not whole:
        return []
    return list(c.pieces) if c.pieces and "".join(c.pieces) == whole else [whole]


def chat_chunks(reply: Mapping[str, Any], choices: Sequence[Choice], include_usage: bool) -> EventStream:
    """The chat reply ``reply`` (:func:`chat_reply` of ``choices``) as ``chat.completion.chunk`` s, as
    OpenAI streams one: per choice a first chunk with the role, the content in pieces, each tool
    call (its index, id and name, then its arguments), the finish reason; then, with
    ``include_usage``, a chunk without choices that carries the usage."""
    head = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"]}
    head["model"] = reply["model"]
    usage: dict[str, Any] = {"usage": None} if include_usage else {}
    chunks: list[dict[str, Any]] = []

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> None:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        chunks.append({**head, "choices": [choice], **usage})

    for out, c in zip(reply["choices"], choices):
        i, msg = out["index"], out["message"]
        lp = out["logprobs"]  # every token's, on the first chunk after the role
        chunk(i, {"role": "assistant", "content": ""})
        for piece in _pieces(c, msg["content"]):
            chunk(i, {"content": piece}, lp=lp)
            lp = None
        for k, call in enumerate(msg.get("tool_calls") or []):
            fn = call["function"]
            first = {"index": k, "id": call["id"], "type": "function"}
            chunk(i, {"tool_calls": [{**first, "function": {"name": fn["name"], "arguments": ""}}]})
            chunk(i, {"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})
        chunk(i, {}, out["finish_reason"], lp)
    if include_usage:
        chunks.append({**head, "choices": [], "usage": reply["usage"]})
    return EventStream(chunks)


def completion_chunks(
    reply: Mapping[str, Any], choices: Sequence[Choice], include_usage: bool
) -> EventStream:
    """The completions reply ``reply`` (:func:`completion_reply` of ``choices``) streamed: per
    choice its text in pieces, then its finish reason; the usage last with ``include_usage``."""
    head = {
        "id": reply["id"],
        "object": "text_completion",
        "created": reply["created"],
        "model": reply["model"],
    }
    usage: dict[str, Any] = {"usage": None} if include_usage else {}
    chunks: list[dict[str, Any]] = []
    for out, c in zip(reply["choices"], choices):
        lp = out["logprobs"]
        for piece in _pieces(c, out["text"]):
            choice = {"index": out["index"], "text": piece, "logprobs": lp, "finish_reason": None}
            chunks.append({**head, "choices": [choice], **usage})
            lp = None
        choice = {"index": out["index"], "text": "", "logprobs": lp, "finish_reason": out["finish_reason"]}
        chunks.append({**head, "choices": [choice], **usage})
    if include_usage:
        chunks.append({**head, "choices": [], "usage": reply["usage"]})
    return EventStream(chunks)
