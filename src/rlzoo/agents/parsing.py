"""Tool calls in a model's turn, per ``rollout.multi_turn.tool_call_format``.

- ``hermes`` (Qwen2.5, Hermes, many instruct models): each call is
  ``<tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>``; ``arguments``
  may also be a JSON string of the object.
- ``plain`` (tiny word-level models that cannot write JSON): a turn whose first word is the name
  of an offered tool calls it, the rest of the turn being its one string argument (the schema's
  first required property, else its first property).

A call that cannot be read (bad JSON, JSON Python refuses -- nested too deep, an integer of
thousands of digits --, no name, an unclosed tag) is returned marked ``malformed`` (with why): the
rollout shows it to the model as an error observation, counts it (``agent/malformed_calls``) and
hands it to the environment in ``AgentTurn.tool_calls`` like the others. Parsing is linear in the
turn's text (a scan with ``str.find``, no backtracking regex).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlzoo.kernel.protocols import Tool, ToolCall

__all__ = ["parse_tool_calls", "schema_problems"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
#: characters of a call's text quoted in its error
_QUOTE = 200


def parse_tool_calls(text: str, fmt: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
    """The calls in ``text``, in order; one that cannot be read is there too, with
    :attr:`~rlzoo.kernel.protocols.ToolCall.malformed` saying why. Linear in ``text``."""
    if fmt == "hermes":
        return _hermes(text)
    if fmt == "plain":
        return _plain(text, tools)
    raise ValueError(f"unknown tool call format {fmt!r}; use 'hermes' or 'plain'")


def _hermes(text: str) -> list[ToolCall]:
    calls: list[ToolCall] = []
    at = text.find(_OPEN)
    while at >= 0:
        start = at + len(_OPEN)
        end = text.find(_CLOSE, start)
        if end < 0:  # unclosed: one malformed call for the rest of the turn (every later tag is in it)
            raw = text[at:]
            calls.append(_bad(raw, f"malformed tool call: {_OPEN} without {_CLOSE}"))
            break
        raw = text[at : end + len(_CLOSE)]
        calls.append(_hermes_call(text[start:end], raw))
        at = text.find(_OPEN, end + len(_CLOSE))
    return calls


def _bad(raw: str, why: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments={}, raw=raw, malformed=why)


def _hermes_call(body: str, raw: str) -> ToolCall:
    body = body.strip()
    quote = body[:_QUOTE]
    if _OPEN in body:  # a second open tag before the close: the first call never closed
        return _bad(raw, f"malformed tool call: {_OPEN} without {_CLOSE} before the next {_OPEN}")
    obj = _json(body)
    if isinstance(obj, str):
        return _bad(raw, f"malformed tool call (not JSON: {obj}): {quote}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return _bad(raw, f'malformed tool call (expected {{"name": ..., "arguments": {{...}}}}): {quote}')
    name = obj["name"]
    args: Any = obj.get("arguments", {})
    if isinstance(args, str):
        args = _json(args) if args.strip() else {}
        if isinstance(args, str):
            return _bad(raw, f"malformed tool call (arguments are not a JSON object): {quote}", name)
    if not isinstance(args, dict):
        return _bad(raw, f"malformed tool call (arguments must be an object): {quote}", name)
    return ToolCall(name=name, arguments=args, raw=raw)


def _json(body: str) -> Any:
    """``json.loads(body)``, or a ``str`` saying why not (bad JSON, nesting too deep for Python's
    parser, an integer past Python's digit limit): never raising. A decoded JSON string comes back
    wrapped in a list so that it is not taken for an error (only objects are calls)."""
    try:
        out = json.loads(body)
    except json.JSONDecodeError as exc:
        return exc.msg
    except RecursionError:
        return "nested too deeply"
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        return str(exc)[:_QUOTE]
    return [out] if isinstance(out, str) else out


def _plain(text: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
    words = text.split(None, 1)
    if not words or words[0] not in tools:
        return []
    tool = tools[words[0]]
    props = list(tool.parameters.get("properties", {}))
    required = list(tool.parameters.get("required", []))
    arg = (required or props or ["input"])[0]
    rest = words[1].strip() if len(words) > 1 else ""
    return [ToolCall(name=words[0], arguments={arg: rest}, raw=text)]


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def schema_problems(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """What a call's arguments break of its tool's schema: required keys, unknown keys (when
    ``additionalProperties`` is false) and the JSON type of each top-level property."""
    props: Mapping[str, Any] = schema.get("properties", {})
    out = [f"missing required argument {r!r}" for r in schema.get("required", []) if r not in arguments]
    for key, value in arguments.items():
        if key not in props:
            if schema.get("additionalProperties") is False:
                out.append(f"unknown argument {key!r}; arguments are {sorted(props)}")
            continue
        want = props[key].get("type") if isinstance(props[key], Mapping) else None
        kinds = _JSON_TYPES.get(want) if isinstance(want, str) else None
        if kinds is not None and (
            not isinstance(value, kinds) or (want != "boolean" and isinstance(value, bool))
        ):
            out.append(f"argument {key!r} must be a {want}, got {type(value).__name__}")
    return out
