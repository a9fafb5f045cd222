"""A plain OpenAI function-calling agent for the tool arithmetic task: the ``quickstart_gateway`` agent.

Nothing in it knows rlzoo: it runs unchanged against any OpenAI-compatible server::

    echo '{"extra_info": {"a": 456, "b": 789}}' | \\
        OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... OPENAI_MODEL=policy \\
        python -m rlzoo.tasks.calc_agent

It reads the row on stdin, asks ``a + b = ? ? ? ?`` (digits as words, for the task's tiny
word-level model), offers a ``calc`` function and runs it itself when the model calls it, and
prints ``{"final_answer": <the model's last reply>}`` (the recipe's scorer judges it). Flags:
``--no-tool`` offers no function (the tool-less variant); ``--turns N`` bounds the model's replies.
It needs the ``openai`` package (``pip install openai``, or rlzoo's ``agents`` extra). The loop
itself is :func:`play` (the ``calc_agent`` Python agent part runs it in the run's process).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def spaced(text: str) -> str:
    return " ".join(text.replace(" ", ""))


def integer_value(expression: str) -> int:
    """The value of an integer expression with + - * and parentheses (spaces ignored). ValueError
    ``cannot evaluate ...`` for anything else, powers included (``9**9**9`` would run for ever); a
    malformed expression raises what Python's parser raises (SyntaxError)."""
    flat = expression.replace(" ", "")
    if not flat or any(c not in "0123456789+-*()" for c in flat) or len(flat) > 64 or "**" in flat:
        raise ValueError(f"cannot evaluate {expression!r}")
    return int(eval(flat, {"__builtins__": {}}, {}))


def calc(expression: str) -> str:
    """``'4 5 6 + 7 8 9'`` -> ``'4 5 6 + 7 8 9 = 1 2 4 5'`` (integer + - * only; else an error text)."""
    try:
        value = integer_value(expression)
    except ValueError as exc:
        return f"error: {exc}"
    except Exception as exc:  # a malformed expression: the model reads the error
        return f"error: {type(exc).__name__}"
    flat = expression.replace(" ", "")
    return f"{' '.join(spaced(flat).split())} = {spaced(str(value))}"


CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an integer arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def question(row: Any) -> str:
    """The row's question: ``'4 5 6 + 7 8 9 = ? ? ? ?'``."""
    a, b = int(row["extra_info"]["a"]), int(row["extra_info"]["b"])
    return f"{spaced(str(a))} + {spaced(str(b))} = " + " ".join("?" * len(str(a + b)))


def play(client: Any, model: str, row: Any, *, tool: bool = True, turns: int = 2) -> str:
    """One episode with the ``openai`` client ``client``: the model's last reply."""
    messages: list[Any] = [{"role": "user", "content": question(row)}]
    kw: dict[str, Any] = {"tools": [CALC]} if tool else {}
    answer = ""
    for _ in range(turns):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=32, **kw)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        answer = msg.content or ""
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            expression = json.loads(call.function.arguments).get("expression", "")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calc(str(expression))})
    return answer


def main(argv: list[str] | None = None) -> int:
    from openai import OpenAI

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-tool", action="store_true", help="offer no calc function")
    ap.add_argument("--turns", type=int, default=2, help="model replies at most")
    args = ap.parse_args(argv)
    row = json.load(sys.stdin)
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
    model = os.environ.get("OPENAI_MODEL", "policy")
    answer = play(client, model, row, tool=not args.no_tool, turns=args.turns)
    print(json.dumps({"final_answer": answer}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
