"""Just enough shell to read a verl launch script: variables, ``${X:-default}``, ``$((...))``, quotes,
comments, line continuations and ``if [ "$a" = "b" ]`` blocks; then the ``python -m verl...`` line."""

from __future__ import annotations

import ast
import operator
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlzoo.errors import RlzooError

# ---------------------------------------------------------------------------------------------
# shell
# ---------------------------------------------------------------------------------------------
_ARITH_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # bash arithmetic is integer
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arith(expr: str, env: Mapping[str, str]) -> int:
    """bash ``$(( ))`` on integers: + - * / % and parentheses; bare names are variables."""

    def name(m: re.Match[str]) -> str:
        return str(env.get(m.group(1), "0") or "0")

    text = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", name, expr)
    text = re.sub(r"\b([A-Za-z_]\w*)\b", name, text)

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            return int(_ARITH_OPS[type(node.op)](ev(node.left), ev(node.right)))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITH_OPS:
            return int(_ARITH_OPS[type(node.op)](ev(node.operand)))
        raise ValueError(f"unsupported shell arithmetic: $(({expr}))")

    return ev(ast.parse(text.strip(), mode="eval"))


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$X``, ``${X}``, ``${X:-default}``, ``${X-default}``, ``$((...))`` and ``$@``."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch != "$":
            out.append(ch)
            i += 1
            continue
        if text.startswith("$((", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            out.append(str(_arith(text[i + 3 : j - 1], env)))
            i = j + 1
        elif text.startswith("${", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            body = text[i + 2 : j]
            m = re.fullmatch(r"([A-Za-z_]\w*|\d+)(:?-)(.*)", body, re.S)
            if m:
                value = env.get(m.group(1))
                empty = value is None or (m.group(2) == ":-" and value == "")
                out.append(_unquote(_expand(m.group(3), env)) if empty else str(value))
            else:
                out.append(env.get(body, ""))
            i = j + 1
        else:
            m = re.match(r"\$([A-Za-z_]\w*|\d|@|\*)", text[i:])
            if m is None:
                out.append(ch)
                i += 1
                continue
            out.append(env.get(m.group(1), "") if m.group(1) not in "@*" else "")
            i += len(m.group(0))
    return "".join(out)


def _unquote(text: str) -> str:
    try:
        words = shlex.split(text, posix=True)
    except ValueError:
        return text
    return " ".join(words) if words else ""


def _span(text: str, i: int) -> int:
    """End (exclusive) of the ``$...`` expansion starting at ``text[i]``."""
    if text.startswith("$((", i) or text.startswith("${", i):
        opener, closer = ("(", ")") if text[i + 1] == "(" else ("{", "}")
        depth, j = 0, i + 1
        while j < len(text):
            depth += 1 if text[j] == opener else -1 if text[j] == closer else 0
            if depth == 0:
                return j + 1
            j += 1
        raise ValueError(f"unclosed {text[i : i + 3]!r} in {text!r}")
    m = re.match(r"\$([A-Za-z_]\w*|\d|@|\*)", text[i:])
    return i + (len(m.group(0)) if m else 1)


def _words(line: str, env: Mapping[str, str]) -> list[str]:
    """Split a command line into words as the shell does: quotes, comments, then expansion
    (``$...`` outside quotes and inside double quotes; a ``$((...))`` is one unit)."""
    words: list[str] = []
    cur: str | None = None
    quoted = False  # an empty word survives only when quoted ("" or a quoted expansion)
    i = 0
    while i < len(line):
        ch = line[i]
        if ch in " \t\n":
            if cur is not None and (cur or quoted):
                words.append(cur)
            cur, quoted = None, False
            i += 1
        elif ch == "#" and cur is None:
            break
        elif ch == "'":
            j = line.index("'", i + 1)
            cur, quoted = (cur or "") + line[i + 1 : j], True
            i = j + 1
        elif ch == '"':
            j = i + 1
            while line[j] != '"':
                j = _span(line, j) if line[j] == "$" else j + (2 if line[j] == "\\" else 1)
            cur, quoted = (cur or "") + _expand(line[i + 1 : j].replace('\\"', '"'), env), True
            i = j + 1
        elif ch == "$":
            j = _span(line, i)
            cur = (cur or "") + _expand(line[i:j], env)
            i = j
        elif ch == "\\" and i + 1 < len(line):
            cur = (cur or "") + line[i + 1]
            i += 2
        else:
            cur = (cur or "") + ch
            i += 1
    if cur is not None and (cur or quoted):
        words.append(cur)
    return words


_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=")
_IF = re.compile(r"^if\s+\[\[?\s+(.+?)\s+(==|=|!=)\s+(.+?)\s+\]\]?\s*;\s*then$")


@dataclass
class Command:
    """A parsed verl launch: the runner its entry point implies and the ``key=value`` overrides."""

    entry: str | None
    overrides: list[tuple[str, str]]  # (key, raw value) in order
    config_name: str | None = None


def parse_command(text: str, env: Mapping[str, str] | None = None) -> Command:
    """Parse a verl launch script (or the override words alone) into a :class:`Command`."""
    env = dict(os.environ if env is None else env)
    joined = re.sub(r"\\\r?\n", " ", text)
    cond: list[bool] = []
    for line in joined.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if m := _IF.match(s):
            a, b = (_unquote(_expand(x, env)) for x in (m.group(1), m.group(3)))
            cond.append((a == b) == (m.group(2) != "!="))
            continue
        if s == "else":
            cond[-1] = not cond[-1]
            continue
        if s == "fi":
            cond.pop()
            continue
        if not all(cond):
            continue
        if m := _ASSIGN.match(s):
            words = _words(s[m.end() :], env)
            env[m.group(1)] = words[0] if words and not s[m.end() :].startswith((" ", "\t")) else ""
            continue
        words = _words(s, env)
        if "-m" in words and words[0].split("/")[-1].startswith("python"):
            module = words[words.index("-m") + 1]
            return _command(module, words[words.index("-m") + 2 :])
    words = _words(joined.replace("\n", " "), env)
    if words and all("=" in w or w.startswith("--") for w in words):
        return _command(None, words)
    raise RlzooError(
        "from-verl: found no `python -m verl...` command and the input is not key=value overrides; "
        "give a verl launch script or its overrides (e.g. algorithm.adv_estimator=grpo ...)"
    )


def _command(module: str | None, words: Sequence[str]) -> Command:
    overrides: list[tuple[str, str]] = []
    config_name = None
    it = iter(words)
    for w in it:
        if w.startswith("--config-name") or w.startswith("--config-path"):
            value = w.split("=", 1)[1] if "=" in w else next(it, "")
            if w.startswith("--config-name"):
                config_name = value
            continue
        if w.startswith("-") or "=" not in w:
            raise RlzooError(f"from-verl: cannot read the argument {w!r} (expected key=value)")
        key, value = w.split("=", 1)
        overrides.append((key.lstrip("+"), value))
    return Command(module, overrides, config_name)


def parse_value(raw: str) -> Any:
    """A Hydra override value: bool, null, int, float, list, or string."""
    import yaml

    s = raw.strip()
    if s.lower() in ("null", "none", "~"):
        return None
    if s in ("True", "true", "False", "false"):
        return s.lower() == "true"
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    if s.startswith("[") or s.startswith("{"):
        try:
            return yaml.safe_load(s)
        except yaml.YAMLError:
            pass
    return s
