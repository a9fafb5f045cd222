"""A plain OpenAI function-calling agent for SmolLM2 on calculator questions: the ``smollm2_gateway`` agent.

Nothing in it knows rlzoo (it shares only calc_agent's plain-Python calculator): it runs unchanged
against any OpenAI-compatible server::

    echo '{"extra_info": {"a": 27, "op": "*", "b": 82}}' | \\
        OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... OPENAI_MODEL=policy \\
        python -m rlzoo.tasks.smol_calc_agent

It asks ``What is 27 * 82?`` with a system prompt that explains the calculator, offers a ``calc``
function (``tools=[calc]``) and runs it itself when the model calls it (a ``role: tool`` reply),
and prints ``{"final_answer": <the model's first reply without a call>, "info": {...}}``; the
recipe's scorer judges the answer. The model may answer directly. A 135M model never calls a
function it was only told about, so the conversation starts with one worked example as ordinary
chat messages (a question, the assistant's ``calc`` call, the function's reply, the answer), as a
few-shot agent prompt would. Flags: ``--no-tool`` offers no function (and shows no example call);
``--no-example`` drops the example; ``--turns N`` bounds the model's replies. It needs the
``openai`` package (``pip install openai``, or rlzoo's ``agents`` extra). The loop itself is
:func:`play` (the ``smol_calc_agent`` Python agent part runs it in the run's process).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rlzoo.tasks.calc_agent import integer_value  # the same calculator (a plain-Python sibling script)

SYSTEM = "You can use a calculator: write calc and the expression. Then reply with only the number."
SYSTEM_NO_TOOL = "Reply with only the number."
#: the worked example's operands (the smollm2_calc dataset never asks them)
EXAMPLE = (12, 34)
MAX_TOKENS = 24

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an integer arithmetic expression such as 27 * 82.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def calc(expression: str) -> str:
    """``'27 * 82'`` -> ``'2214'`` (integers with + - * and parentheses; else an error text)."""
    try:
        return str(integer_value(expression))
    except ValueError as exc:
        return f"error: {exc}"
    except Exception as exc:  # a malformed expression: the model reads the error
        return f"error: {type(exc).__name__}"


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def first_messages(row: Any, *, tool: bool = True, example: bool = True) -> list[dict[str, Any]]:
    """The system prompt, the worked example (with the tool and ``example``) and the row's question."""
    info = row["extra_info"]
    a, op, b = int(info["a"]), str(info["op"]), int(info["b"])
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM if tool else SYSTEM_NO_TOOL}]
    if tool and example:
        ea, eb = EXAMPLE
        expression = f"{ea} {op} {eb}"
        result = calc(expression)
        call = {
            "id": "call_0",
            "type": "function",
            "function": {"name": "calc", "arguments": json.dumps({"expression": expression})},
        }
        messages += [
            {"role": "user", "content": question(ea, op, eb)},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": result},
            {"role": "assistant", "content": result},
        ]
    messages.append({"role": "user", "content": question(a, op, b)})
    return messages


def play(
    client: Any, model: str, row: Any, *, tool: bool = True, example: bool = True, turns: int = 3
) -> tuple[str, dict[str, float]]:
    """One episode with the ``openai`` client ``client``: the model's answer (its first reply without
    a call, else its last) and what happened (``calls``: function calls made, ``replies``: model calls)."""
    messages = first_messages(row, tool=tool, example=example)
    kw: dict[str, Any] = {"tools": [CALC]} if tool else {}
    answer, calls, replies = "", 0, 0
    for _ in range(turns):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, **kw)
        replies += 1
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        answer = msg.content or ""
        if not msg.tool_calls:
            break
        for c in msg.tool_calls:
            calls += 1
            try:
                expression = str(json.loads(c.function.arguments).get("expression", ""))
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": c.id, "content": calc(expression)})
    return answer, {"calls": float(calls), "replies": float(replies), "called": float(calls > 0)}


def main(argv: list[str] | None = None) -> int:
    from openai import OpenAI

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-tool", action="store_true", help="offer no calc function")
    ap.add_argument("--no-example", action="store_true", help="show no worked example")
    ap.add_argument("--turns", type=int, default=3, help="model replies at most")
    args = ap.parse_args(argv)
    row = json.load(sys.stdin)
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
    model = os.environ.get("OPENAI_MODEL", "policy")
    answer, info = play(
        client, model, row, tool=not args.no_tool, example=not args.no_example, turns=args.turns
    )
    print(json.dumps({"final_answer": answer, "info": info}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
