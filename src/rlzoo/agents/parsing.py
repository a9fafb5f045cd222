"""Tool calls in a model's turn, per ``rollout.multi_turn.tool_call_format``.

- ``hermes`` (Qwen2.5, Hermes, many instruct models): each call is
  ``<tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>``; ``arguments``
  may also be a JSON string of the object.
- ``plain`` (tiny word-level models that cannot write JSON): a turn whose first word is the name
  of an offered tool calls it, the rest of the turn being its one string argument (the schema's
  first required property, else its first property).

A call that cannot be read (bad JSON, no name, an unclosed tag) is returned as an error text: the
rollout shows it to the model as an error observation and counts it (``agent/malformed_calls``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rlzoo.kernel.protocols import Tool, ToolCall

__all__ = ["parse_tool_calls", "schema_problems"]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse_tool_calls(text: str, fmt: str, tools: Mapping[str, Tool]) -> tuple[list[ToolCall], list[str]]:
    """The calls in ``text`` and an error text per call that could not be read."""
    if fmt == "hermes":
        return _hermes(text)
    if fmt == "plain":
        return _plain(text, tools)
    raise ValueError(f"unknown tool call format {fmt!r}; use 'hermes' or 'plain'")


def _hermes(text: str) -> tuple[list[ToolCall], list[str]]:
    calls: list[ToolCall] = []
    errors: list[str] = []
    matches = list(_HERMES.finditer(text))
    for m in matches:
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"malformed tool call (not JSON: {exc.msg}): {body[:200]}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(
                f'malformed tool call (expected {{"name": ..., "arguments": {{...}}}}): {body[:200]}'
            )
            continue
        args: Any = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                errors.append(f"malformed tool call (arguments are not a JSON object): {body[:200]}")
                continue
        if not isinstance(args, dict):
            errors.append(f"malformed tool call (arguments must be an object): {body[:200]}")
            continue
        calls.append(ToolCall(name=obj["name"], arguments=args, raw=m.group(0)))
    if text.count("<tool_call>") > len(matches):
        errors.append("malformed tool call: <tool_call> without </tool_call>")
    return calls, errors


def _plain(text: str, tools: Mapping[str, Tool]) -> tuple[list[ToolCall], list[str]]:
    words = text.split(None, 1)
    if not words or words[0] not in tools:
        return [], []
    tool = tools[words[0]]
    props = list(tool.parameters.get("properties", {}))
    required = list(tool.parameters.get("required", []))
    arg = (required or props or ["input"])[0]
    rest = words[1].strip() if len(words) > 1 else ""
    return [ToolCall(name=words[0], arguments={arg: rest}, raw=text)], []


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
