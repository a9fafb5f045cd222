"""Read a verl launch script the way bash would, without running anything, and find its launch.

Why not a bash parser from PyPI: ``bashlex`` 0.18 (the maintained one) rejects arrays (``A=(x y)``),
``[[ ... ]]`` tests and ``$((...))`` arithmetic, and splits ``${X:-"${HOME}/m"}`` at the inner
``}``; verl's own scripts use all four. So the reader is rlzoo's own, in two modules:
:mod:`rlzoo_from_verl.bash_syntax` turns the text into commands (``while`` loops, groups and
subshells are refused there, with their line), and this module gives them meaning: it runs
assignments (``X=...``, ``export``, ``declare``, ``local``, arrays, ``unset``), evaluates ``[ ]`` /
``[[ ]]`` / ``test`` conditions and ``case`` patterns, runs ``for`` loops and functions, expands
words (``${X:-d}`` and friends, ``${X:off:len}``, ``$((...))``, arrays, field splitting) and stops at
the first verl launch:
``python3 -m MOD``, ``torchrun ... -m MOD``, ``ray job submit ... -- python3 -m MOD``.

Nothing is executed. A command substitution (``$(...)`` or backquotes) is never run. Two are read
without running them, each said in the notes: ``$(pwd)`` is the directory from-verl runs in, and
``$(date [-u] [+FORMAT])`` the time of the conversion. Any other one: the variable it
feeds is marked unknown, reported, and an error names it if the launch uses it (pass the value with
``--env NAME=VALUE``, which fixes ``NAME`` and skips the script's own assignments to it). A launch
argument that reads an unset variable is refused the same way. A test of the file system (``-d``,
``-f``) or of a command's exit status, whose answer depends on the machine the script runs on, is
refused when its answer matters. A ``for`` loop over a command substitution is followed only when
its body only unsets variables: every variable set before it is then unknown after it. Setting up a
Python environment (``eval "$(conda shell.bash hook)"``, ``conda activate X``, ``source X/bin/activate``)
is skipped and said; any other ``source``,
``eval``, ``read`` and ``exit`` before the launch are refused. Every error is a :class:`~rlzoo.kernel.errors.RlzooError` (:class:`ShellError` for a construct).
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo_from_verl.bash_syntax import (
    ASSIGN,
    NAME,
    AndOr,
    Case,
    For,
    FuncDef,
    If,
    Pipeline,
    ShellError,
    Simple,
    Tok,
    parse,
    skip_quoted,
)


class _Return(Exception):
    """``return`` inside a function."""


class _Break(Exception):
    """``break`` (``again``: False) or ``continue`` (True) inside a for loop."""

    def __init__(self, again: bool) -> None:
        super().__init__()
        self.again = again


_MAX_CALLS = 50
_MAX_ITERATIONS = 10_000
#: the most characters one variable (or one launch argument) may hold: verl's longest real values (file
#: lists) are a few KiB; past this a script is doubling a value (``A=$A$A``) into gigabytes
MAX_VALUE_CHARS = 1 << 20


class _Unresolved(Exception):
    """An expansion met a value rlzoo cannot know (a command substitution, a missing variable)."""

    def __init__(self, origin: Unknown) -> None:
        super().__init__(origin.why)
        self.origin = origin


@dataclass(frozen=True)
class Unknown:
    """A value rlzoo does not know (a command substitution, an unset variable): ``var`` is the
    variable to pass with ``--env`` ("" when there is none), ``why`` says where it came from."""

    var: str
    line: int
    why: str


# ---------------------------------------------------------------------------------------------
# the interpreter: assignments, tests, expansion, the launch
# ---------------------------------------------------------------------------------------------
Value = str | list[str] | Unknown

_ARITH_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # bash arithmetic is integer
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


@dataclass
class Launch:
    """The verl launch found in a script: its module, the argument words and where it was."""

    module: str
    args: list[str]
    line: int
    notes: list[str] = field(default_factory=list)


@dataclass
class Command:
    """A parsed verl launch: the runner its entry point implies and the ``key=value`` overrides."""

    entry: str | None
    overrides: list[tuple[str, str]]  # (key, raw value) in order
    config_name: str | None = None
    notes: list[str] = field(default_factory=list)  # what the reader did not run, and why it did not matter


class _Interp:
    def __init__(self, env: Mapping[str, str], fixed: Mapping[str, str]) -> None:
        self.vars: dict[str, Value] = {**env, **fixed}
        self.fixed = set(fixed)
        self.notes: list[str] = []
        self.launch: Launch | None = None
        self.other_python: list[str] = []
        # variables whose value read an unset variable: bash reads "" there, a launch must not
        self.taint: dict[str, Unknown] = {}
        self.hits: list[Unknown] = []  # unset variables the current expansion read
        self.functions: dict[str, FuncDef] = {}
        self.positional: list[list[str]] = []  # the arguments of each function call in progress
        self.saved_locals: list[dict[str, Value | None]] = []  # outer values of each call's `local`s
        self.loops = 0  # for loops in progress (break / continue)
        self.now = time.time()  # one clock for every $(date ...) of a script, as its lines run in a second

    # -- statements ---------------------------------------------------------------------------
    def run(self, body: Iterable[AndOr]) -> None:
        for ao in body:  # checked after each command: the script's text after the launch is never read
            self.and_or(ao)
            if self.launch is not None:
                return

    def and_or(self, ao: AndOr) -> bool | None:
        status: bool | None = True
        for conn, pipe in ao.items:
            if (conn == "&&" and status is False) or (conn == "||" and status is True):
                continue
            if conn == "||" and status is None:
                if _assigns_or_launches(pipe, self.functions):
                    raise ShellError(
                        pipe.line,
                        "`a || b` where b sets variables or launches, after a command whose success "
                        "rlzoo cannot know",
                    )
                continue
            # `cmd && next` after a command rlzoo does not run (mkdir, cd, pip ...): read as if it succeeded
            status = self.pipeline(pipe)
            if self.launch is not None:
                return True
        return status

    def pipeline(self, pipe: Pipeline) -> bool | None:
        status: bool | None = None
        for cmd in pipe.cmds:
            if isinstance(cmd, If):
                status = self.if_(cmd)
            elif isinstance(cmd, Case):
                status = self.case(cmd)
            elif isinstance(cmd, FuncDef):
                self.functions[cmd.name] = cmd
                status = True
            elif isinstance(cmd, For):
                status = self.for_(cmd)
            else:
                status = self.simple(cmd)
            if self.launch is not None:
                return True
        if pipe.negate and status is not None:
            status = not status
        return status

    def if_(self, node: If) -> bool | None:
        for cond, body in node.clauses:
            results = [self.and_or(ao) for ao in cond]
            if self.launch is not None:
                raise ShellError(node.line, "a launch inside an if condition")
            ok = results[-1] if results else True
            if ok is None:
                raise ShellError(
                    cond[-1].line if cond else node.line,
                    "an if on the exit status of a command; rlzoo runs no commands "
                    "(test variables with [ ... ] / [[ ... ]], or edit the script)",
                )
            if ok:
                self.run(body)
                return True
        if node.orelse is not None:
            self.run(node.orelse)
        return True

    def for_(self, node: For) -> bool:
        self.hits = []
        try:
            if node.words is None:  # `for X; do`: the arguments
                items = list(self.positional[-1]) if self.positional else []
                if not self.positional:
                    self.note_args(node.line)
            else:
                items = [f for t in node.words for f in self.expand(t.text, t.line)]
        except _Unresolved as e:
            self.for_unknown(node, e.origin)
            return True
        hits = list(self.hits)
        if len(items) > _MAX_ITERATIONS:
            raise ShellError(node.line, f"a for loop over more than {_MAX_ITERATIONS} words")
        self.loops += 1
        try:
            for k, item in enumerate(items):
                if node.var in self.fixed:
                    self.note_fixed(node.line, node.var, "the for loop's assignment")
                else:
                    self.vars[node.var] = item
                    self.hits = hits
                    self._set_taint(node.var)
                try:
                    self.run(node.body)
                except _Break as b:
                    if not b.again:
                        break
                if self.launch is not None:
                    if len(items) > 1:
                        self.notes.append(
                            f"line {node.line}: the launch is in a for loop over {len(items)} words; "
                            f"the first launch ({node.var}={item!r}, pass {k + 1}) is the one converted"
                        )
                    return True
        finally:
            self.loops -= 1
        return True

    def for_unknown(self, node: For, origin: Unknown) -> None:
        """A for loop over words rlzoo cannot know: followed only when its body only unsets
        variables; then every variable set now may be unset after it."""
        only_unset = all(
            len(ao.items) == 1
            and all(
                isinstance(c, Simple) and not c.assigns and c.words and c.words[0].text == "unset"
                for c in ao.items[0][1].cmds
            )
            for ao in node.body
        )
        if not only_unset:
            raise ShellError(
                node.line,
                f"a for loop over {origin.why}: rlzoo cannot know what it runs (edit a copy of the script)",
            )
        for name, value in list(self.vars.items()):
            if name not in self.fixed and not isinstance(value, Unknown):
                why = (
                    f"${name}, which the for loop at line {node.line} may unset (it loops over {origin.why})"
                )
                self.vars[name] = Unknown(name, node.line, why)
        self.notes.append(
            f"line {node.line}: a for loop over {origin.why} unsets variables rlzoo cannot name: "
            "a variable set before it is known after it only when the script sets it again or --env gives it"
        )

    def note_fixed(self, line: int, name: str, what: str) -> None:
        self.notes.append(f"line {line}: {name} kept as given with --env ({what} skipped)")

    def case(self, node: Case) -> bool:
        try:
            value = self.expand(node.word.text, node.word.line, split=False)[0]
        except _Unresolved as e:
            raise ShellError(node.line, f"a case on {e.origin.why}") from None
        for patterns, body in node.items:
            if any(re.fullmatch(self.pattern(p.text, p.line), value, re.S) for p in patterns):
                self.run(body)
                return True
        return True

    def call(self, fn: FuncDef, args: list[str], line: int) -> bool:
        if len(self.positional) >= _MAX_CALLS:
            raise ShellError(line, f"function calls nested deeper than {_MAX_CALLS} ({fn.name!r})")
        self.positional.append(args)
        self.saved_locals.append({})
        try:
            self.run(fn.body)
        except _Return:
            pass
        finally:
            self.positional.pop()
            for name, old in self.saved_locals.pop().items():
                if old is None:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = old
        return True

    def simple(self, cmd: Simple) -> bool | None:
        if not cmd.words:
            for t in cmd.assigns:
                self.assign(t)
            return True
        # prefix assignments (X=1 cmd) reach only that command's environment, not shell variables
        head = self.try_fields(cmd.words[0])
        name = head[0] if head else ""
        if name in ("[", "[[", "test"):
            return self.test(cmd)
        if name in self.functions:
            fn_words, _ = self.expand_words(cmd.words[1:])
            if any(not isinstance(w, str) for w in fn_words):
                raise ShellError(cmd.line, f"{name!r} is called with a value rlzoo does not know")
            return self.call(self.functions[name], [str(w) for w in fn_words], cmd.line)
        if name == "return":
            if not self.positional:
                raise ShellError(cmd.line, "`return` outside a function")
            raise _Return
        if name in ("break", "continue"):
            if not self.loops:
                raise ShellError(cmd.line, f"`{name}` outside a for loop")
            if len(cmd.words) > 1 and cmd.words[1].text != "1":
                raise ShellError(cmd.line, f"`{name} {cmd.words[1].text}` (more than one loop level)")
            raise _Break(again=name == "continue")
        if name == "local" and self.saved_locals:
            for t in cmd.words[1:]:
                m = re.match(NAME, t.text.rstrip("=").rstrip("+")) if not t.text.startswith("-") else None
                if m and m.group(0) not in self.saved_locals[-1]:
                    old = self.vars.get(m.group(0))
                    self.saved_locals[-1][m.group(0)] = old
        if name == "shift":
            if self.positional and self.positional[-1]:
                self.positional[-1] = self.positional[-1][1:]
            return True
        if name in ("export", "declare", "typeset", "local", "readonly"):
            for t in cmd.words[1:]:
                if t.kind == "array" or ASSIGN.match(t.text):
                    self.assign(t)
                elif not t.text.startswith("-") and not re.fullmatch(NAME, t.text):
                    raise ShellError(t.line, f"{name} {t.text!r}")
            return True
        if name == "unset":
            for t in cmd.words[1:]:
                if t.text.startswith("-"):
                    continue
                try:
                    target = self.expand(t.text, t.line, split=False)[0]
                except _Unresolved as e:
                    raise ShellError(
                        t.line, f"`unset` of a name rlzoo does not know ({e.origin.why})"
                    ) from None
                if target in self.fixed:
                    self.note_fixed(t.line, target, "the script's unset")
                    continue
                self.vars.pop(target, None)
                self.taint.pop(target, None)
            return True
        activation = _activation(name, cmd.words)
        if activation is not None:
            self.note_once(f"line {cmd.line}: {activation} activates a Python environment: skipped")
            return True
        if name in (
            "source",
            ".",
            "eval",
            "read",
            "mapfile",
            "readarray",
            "let",
            "getopts",
            "alias",
        ):
            if name in ("source", "."):
                text = _short(" ".join(t.text for t in cmd.words))
                hint = (
                    f"{text} reads another file: inline its variables, or pass them with --env "
                    "NAME=VALUE (if it only sets up the machine, e.g. a toolkit's set_env.sh, delete "
                    "it from a copy of the script)"
                )
            elif name == "eval":
                text = _short(" ".join(t.text for t in cmd.words))
                hint = (
                    f"{text} runs text rlzoo cannot see, which may set any variable; if it only "
                    "activates an environment (conda), delete it (and the `conda activate` after it) "
                    "from a copy of the script"
                )
            else:
                hint = "it sets variables from input rlzoo does not have; pass them with --env NAME=VALUE"
            raise ShellError(cmd.line, f"`{name}`: {hint}")
        if name in ("true", ":"):
            return True
        if name == "false":
            return False
        if name == "exit":
            raise ShellError(
                cmd.line,
                "the script exits here, before any verl launch (if a test above led here, set the "
                "variables it tests with --env NAME=VALUE)",
            )
        words, origins = self.expand_words(cmd.words)
        found = _find_launch(words)
        if found is None:
            return None
        module, start = found
        if start < 0:
            shown = " ".join(w if isinstance(w, str) else "?" for w in words)
            self.other_python.append(f"line {cmd.line}: {_short(shown)}")
            return None
        args: list[str] = []
        unknown: list[tuple[Unknown, str]] = []  # every value the launch needs, reported at once
        for w, origin in zip(words[start:], origins[start:], strict=True):
            if isinstance(w, Unknown):
                unknown.append((w, ""))
            elif origin is not None:
                unknown.append((origin, w))
            else:
                args.append(w)
        if unknown:
            raise _launch_error(unknown)
        self.launch = Launch(module, args, cmd.line, self.notes)
        return True

    def assign(self, t: Tok) -> None:
        if t.kind == "array":
            name, append = t.text.rstrip("=").rstrip("+"), t.text.endswith("+=")
            if name in self.fixed:
                self.notes.append(
                    f"line {t.line}: {name} kept as given with --env (the script's array skipped)"
                )
                return
            items: list[str] = []
            self.hits = []
            for raw, line in t.items:
                try:
                    items += self.expand(raw, line)
                except _Unresolved as e:
                    self.vars[name] = Unknown(e.origin.var or name, e.origin.line, e.origin.why)
                    self.notes.append(f"line {t.line}: {name} <- {e.origin.why}")
                    return
            old = self.vars.get(name)
            base = (old if isinstance(old, list) else [old] if isinstance(old, str) else []) if append else []
            self.vars[name] = _bounded(name, base + items, t.line)
            self._set_taint(name)
            return
        m = ASSIGN.match(t.text)
        assert m is not None
        name, append, raw = m.group(1), m.group(2) == "+", t.text[m.end() :]
        if name in self.fixed:
            self.notes.append(
                f"line {t.line}: {name} kept as given with --env (the script's assignment skipped)"
            )
            return
        self.hits = []
        try:
            value = self.expand(raw, t.line, split=False, assignment=True)[0]
        except _Unresolved as e:
            o = e.origin
            why = o.why if o.var else f"${name}, set from {o.why}"
            self.vars[name] = Unknown(o.var or name, t.line, why)
            self.notes.append(f"line {t.line}: {name} not known: {o.why}")
            return
        old = self.vars.get(name)
        if append and isinstance(old, list):
            self.vars[name] = _bounded(name, [*old[:-1], old[-1] + value] if old else [value], t.line)
        elif append and isinstance(old, str):
            self.vars[name] = _bounded(name, old + value, t.line)
        else:
            self.vars[name] = _bounded(name, value, t.line)
        self._set_taint(name)

    def _set_taint(self, name: str) -> None:
        if self.hits:
            self.taint[name] = self.hits[0]
        else:
            self.taint.pop(name, None)

    def expand_words(self, toks: Sequence[Tok]) -> tuple[list[str | Unknown], list[Unknown | None]]:
        """Each token's fields, and per field the unset variable it read (None when it read none)."""
        out: list[str | Unknown] = []
        origins: list[Unknown | None] = []
        for t in toks:
            if t.kind == "array":
                raise ShellError(t.line, "an array assignment as a command argument")
            self.hits = []
            try:
                fields: list[str | Unknown] = list(self.expand(t.text, t.line))
            except _Unresolved as e:
                fields = [e.origin]
            for f in fields:
                if isinstance(f, str):
                    _bounded("an argument", f, t.line)
            out += fields
            origins += [self.hits[0] if self.hits else None] * len(fields)
        return out, origins

    def try_fields(self, t: Tok) -> list[str]:
        try:
            return self.expand(t.text, t.line)
        except _Unresolved:
            return []

    # -- tests --------------------------------------------------------------------------------
    def test(self, cmd: Simple) -> bool:
        toks = cmd.words
        head = toks[0].text
        double = head == "[["
        if head in ("[", "[["):
            closer = "]" if head == "[" else "]]"
            if toks[-1].text != closer:
                raise ShellError(cmd.line, f"{head} without a closing {closer}")
            toks = toks[1:-1]
        else:
            toks = toks[1:]
        items: list[tuple[str, Tok]] = []
        for t in toks:
            try:
                if double:  # no field splitting inside [[ ]]
                    items.append((self.expand(t.text, t.line, split=False)[0], t))
                else:
                    items += [(f, t) for f in self.expand(t.text, t.line)]
            except _Unresolved as e:
                fix = f"; pass it with --env {e.origin.var}=VALUE" if e.origin.var else ""
                raise ShellError(t.line, f"the test reads {e.origin.why}{fix}") from None
        return _TestEval(items, double, cmd.line, self.pattern).run()

    # -- expansion ----------------------------------------------------------------------------
    def expand(self, raw: str, line: int, split: bool = True, assignment: bool = False) -> list[str]:
        """``raw`` word -> fields: quotes removed, ``$...`` expanded, unquoted expansions split."""
        whole = re.fullmatch(r'"\$(@|\{[^{}"`$]*\})"', raw)
        if whole and split:  # "$@" / "${arr[@]}" / "${@:2}": one field per element, none when empty
            if whole.group(1) == "@":
                if self.positional:
                    return list(self.positional[-1])
                self.note_args(line)
                return []
            value = self.braced(whole.group(1)[1:-1], line, quoted=True)
            return value if isinstance(value, list) else [value]
        # pieces: (text, splittable); None marks a field boundary (quoted "${arr[@]}")
        pieces: list[tuple[str, bool] | None] = []
        quoted_any = False
        i, n = 0, len(raw)
        # a leading ~, or one right after the = of an assignment-like word (NAME=~/x), is $HOME
        m = re.match(NAME + "=", raw) if not assignment else None
        tilde_at = m.end() if m else 0
        if raw[tilde_at : tilde_at + 1] == "~" and raw[tilde_at + 1 : tilde_at + 2] in ("", "/", ":"):
            pieces.append((raw[:tilde_at], False))
            pieces.append((self.get_scalar("HOME", line), False))
            i = tilde_at + 1
        while i < n:
            c = raw[i]
            if c == "\\":
                pieces.append((raw[i + 1 : i + 2], False))
                i += 2
            elif c == "'":
                j = raw.find("'", i + 1)
                if j < 0:
                    raise ShellError(line, "a single quote (') is never closed")
                pieces.append((raw[i + 1 : j], False))
                quoted_any, i = True, j + 1
            elif c == '"':
                j = skip_quoted(raw, i, line)
                pieces += self.expand_dq(raw[i + 1 : j - 1], line)
                quoted_any, i = True, j
            elif c in "$`":
                j, vals = self.dollar(raw, i, line)
                if isinstance(vals, list):  # unquoted ${arr[@]}: each element, then split
                    for k, v in enumerate(vals):
                        if k:
                            pieces.append(None)
                        pieces.append((v, split))
                else:
                    pieces.append((vals, split))
                i = j
            elif assignment and c == ":" and raw[i + 1 : i + 2] == "~":
                pieces.append((":" + self.get_scalar("HOME", line), False))
                i += 2
            else:
                j = i
                while j < n and raw[j] not in "\\'\"$`" and not (assignment and raw[j] == ":"):
                    j += 1
                j = max(j, i + 1)
                pieces.append((raw[i:j], False))
                i = j
        fields: list[str] = []
        cur: str | None = "" if quoted_any else None
        for p in pieces:
            if p is None:
                if cur is not None:
                    fields.append(cur)
                cur = None
                continue
            text, splittable = p
            if not splittable:
                cur = (cur or "") + text
                continue
            for k, part in enumerate(re.split(r"[ \t\n]+", text)):
                if k:
                    if cur:
                        fields.append(cur)
                    cur = None
                if part:
                    cur = (cur or "") + part
        if cur is not None:
            fields.append(cur)
        if not split:
            return [" ".join(fields)]
        return fields

    def expand_dq(self, body: str, line: int) -> list[tuple[str, bool] | None]:
        out: list[tuple[str, bool] | None] = []
        i, n = 0, len(body)
        buf = ""
        while i < n:
            c = body[i]
            if c == "\\" and body[i + 1 : i + 2] in ('"', "\\", "$", "`"):
                buf += body[i + 1]
                i += 2
            elif c == "\\" and body[i + 1 : i + 2] == "\n":
                i += 2
            elif c in "$`":
                j, vals = self.dollar(body, i, line, quoted=True)
                if isinstance(vals, list):
                    out.append((buf, False))
                    buf = ""
                    for k, v in enumerate(vals):
                        if k:
                            out.append(None)
                        out.append((v, False))
                else:
                    buf += vals
                i = j
            else:
                buf += c
                i += 1
        out.append((buf, False))
        return out

    def dollar(self, s: str, i: int, line: int, quoted: bool = False) -> tuple[int, str | list[str]]:
        """Expand the ``$...`` (or backquote) at ``s[i]``: (end index, value or array fields)."""
        if s[i] == "`" or (s.startswith("$(", i) and not s.startswith("$((", i)):
            j = skip_quoted(s, i, line)
            inner = s[i + 1 : j - 1] if s[i] == "`" else s[i + 2 : j - 1]
            known = self.known_substitution(inner, line)
            if known is not None:
                return j, known
            why = f"the command substitution {_short(s[i:j])} (rlzoo runs no commands)"
            raise _Unresolved(Unknown("", line, why))
        if s.startswith("$((", i):
            j = skip_quoted(s, i, line)
            if not s[:j].endswith("))"):
                raise ShellError(line, f"{_short(s[i:j])}: an arithmetic expansion must end with ))")
            return j, str(self.arith(s[i + 3 : j - 2], line))
        if s.startswith("${", i):
            j = skip_quoted(s, i, line)
            return j, self.braced(s[i + 2 : j - 1], line, quoted)
        if s[i + 1 : i + 2] in ("'", '"') and not quoted:
            raise ShellError(line, f"the {s[i : i + 2]}...{s[i + 1]} quoting")
        m = re.match(rf"\$({NAME}|[0-9@*#?$!-])", s[i:])
        if m is None:
            return i + 1, "$"
        name = m.group(1)
        j = i + len(m.group(0))
        if name in ("@", "*"):
            if self.positional:
                args = self.positional[-1]
                return j, list(args) if name == "@" else " ".join(args)
            self.note_args(line)
            return j, [] if name == "@" and quoted else ""
        if name == "#":
            return j, str(len(self.positional[-1])) if self.positional else "0"
        if name in ("?", "$", "!", "-"):
            raise ShellError(line, f"${name} (a value from running commands)")
        if name == "0" and "0" not in self.vars:
            raise _Unresolved(Unknown("0", line, "$0 (the script's own path)"))
        return j, self.get_scalar(name, line)

    def known_substitution(self, inner: str, line: int) -> str | None:
        """The value of ``$(pwd)`` (the directory from-verl runs in) and ``$(date [-u] [+FORMAT])`` (this
        conversion's time), each said in the notes; None for any other command (never run)."""
        try:
            argv = shlex.split(inner.strip())
        except ValueError:
            return None
        if any("$" in a or "`" in a for a in argv):  # a nested expansion: not read here
            return None
        if argv in (["pwd"], ["pwd", "-L"], ["pwd", "-P"]):
            value = os.getcwd()
            self.note_once(
                f"line {line}: $({inner.strip()}) read as {value} (the directory from-verl runs in)"
            )
            return value
        if argv[:1] == ["date"] and len(argv) <= 3:
            rest = argv[1:]
            utc = "-u" in rest or "--utc" in rest
            formats = [a for a in rest if a.startswith("+")]
            if len(formats) + sum(a in ("-u", "--utc") for a in rest) != len(rest) or len(formats) > 1:
                return None  # -d, -r, --iso-8601 ...: options rlzoo does not read
            stamp = _date(self.now, formats[0][1:] if formats else "%a %b %e %H:%M:%S %Z %Y", utc)
            if stamp is None:
                return None
            self.note_once(
                f"line {line}: $({inner.strip()}) read as {stamp!r} (the time of this conversion, not of the run)"
            )
            return stamp
        return None

    def note_once(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def note_args(self, line: int) -> None:
        note = (
            f"line {line}: $@ (the script's own arguments) is empty here; put extra overrides in the script"
        )
        if note not in self.notes:
            self.notes.append(note)

    def braced(self, body: str, line: int, quoted: bool) -> str | list[str]:
        if body[:1] in ("@", "*") and (len(body) == 1 or body[1] == ":"):  # ${@} ${@:2} ${*:1:2}
            if self.positional:
                args = list(self.positional[-1])
            else:
                self.note_args(line)
                args = []
            if body[1:]:  # the offset counts $0, the script's path
                zero = self.vars.get("0", "\0$0")
                args = self.slice([zero if isinstance(zero, str) else "\0$0", *args], body[2:], line)
                if "\0$0" in args:
                    raise _Unresolved(Unknown("0", line, f"${{{body}}} (it holds $0, the script's own path)"))
            return args if (body[0] == "@" or not quoted) else " ".join(args)
        if body.startswith("#") and len(body) > 1:
            name = body[1:]
            m = re.fullmatch(rf"({NAME})\[[@*]\]", name)
            if m:
                return str(len(self.get_array(m.group(1), line)))
            if re.fullmatch(NAME + "|[0-9]+", name):
                return str(len(self.get_scalar(name, line)))
            raise ShellError(line, f"${{{body}}}")
        if body.startswith("!"):
            raise ShellError(line, f"${{{body}}} (indirect expansion)")
        m = re.fullmatch(rf"({NAME})\[[@*]\]:(.*)", body, re.S)
        if m:  # ${A[@]:offset:length}
            sliced = self.slice(self.get_array(m.group(1), line), m.group(2), line)
            return sliced if (body[len(m.group(1)) + 1] == "@" or not quoted) else " ".join(sliced)
        m = re.fullmatch(rf"({NAME})\[([^\]]*)\]", body)
        if m:
            if m.group(1) == "BASH_SOURCE" and "BASH_SOURCE" not in self.vars:
                raise _Unresolved(Unknown("", line, "${BASH_SOURCE[...]} (the script's own path)"))
            arr = self.get_array(m.group(1), line)
            idx = m.group(2)
            if idx in ("@", "*"):
                return arr if (idx == "@" or not quoted) else " ".join(arr)
            k = self.arith(idx, line)
            return arr[k] if -len(arr) <= k < len(arr) else ""
        m = re.fullmatch(rf"({NAME}|[0-9]+)(.*)", body, re.S)
        if m is None:
            raise ShellError(line, f"${{{body}}}")
        name, rest = m.group(1), m.group(2)
        if rest == "":
            return self.get_scalar(name, line)
        if rest[:1] == ":" and rest[1:2] not in ("-", "=", "+", "?"):  # ${X:offset} ${X:offset:length}
            return self.slice(self.get_scalar(name, line), rest[1:], line)
        op_m = re.match(r"(:?[-=+?])|(##|#|%%|%|\^\^|,,|\^|,|//|/#|/%|/)", rest)
        if op_m is None:
            raise ShellError(line, f"${{{body}}}")
        op, word = op_m.group(0), rest[op_m.end() :]
        if op.startswith("/"):  # ${X/pattern/replacement} and friends
            text = self.get_scalar(name, line)
            cut = re.search(r"(?<!\\)/", word)
            pat_raw, rep_raw = (word[: cut.start()], word[cut.end() :]) if cut else (word, "")
            regex = self.pattern(pat_raw, line)
            if not regex:
                return text
            replacement = self.expand_word(rep_raw, line)
            if op == "/#":
                regex = "^(?:" + regex + ")"
            elif op == "/%":
                regex = "(?:" + regex + ")$"
            # bash takes the longest match at each position, as a greedy regex does
            return re.sub(regex, lambda _m: replacement, text, count=0 if op == "//" else 1, flags=re.S)
        if op in ("-", ":-", "=", ":=", "+", ":+", "?", ":?"):
            value = self.lookup(name)
            if isinstance(value, Unknown):
                raise _Unresolved(value)
            if isinstance(value, list):
                value = value[0] if value else ""
            unset = value is None or (op.startswith(":") and value == "")
            if op.endswith("+"):
                return "" if unset else self.expand_word(word, line)
            if not unset:
                if name in self.taint:
                    self.hits.append(self.taint[name])
                return str(value)
            if op.endswith("?"):
                raise _Unresolved(
                    Unknown(name, line, f"${name}, which the script requires ({word or 'unset'})")
                )
            default = self.expand_word(word, line)
            if op.endswith("="):
                if name in self.fixed or not re.fullmatch(NAME, name):
                    raise ShellError(line, f"${{{body}}} assigns to {name}")
                self.vars[name] = default
            return default
        text = self.get_scalar(name, line)
        if op in ("^^", ",,", "^", ","):
            if word:
                raise ShellError(line, f"${{{body}}}")
            if op == "^^":
                return text.upper()
            if op == ",,":
                return text.lower()
            return (text[:1].upper() if op == "^" else text[:1].lower()) + text[1:]
        pattern = self.expand_word(word, line)
        if op in ("#", "##"):
            for k in range(len(text) + 1) if op == "#" else range(len(text), -1, -1):
                if fnmatch.fnmatchcase(text[:k], pattern):
                    return text[k:]
            return text
        for k in range(len(text), -1, -1) if op == "%" else range(len(text) + 1):
            if fnmatch.fnmatchcase(text[k:], pattern):
                return text[:k]
        return text

    def slice(self, seq: Any, spec: str, line: int) -> Any:
        """bash's ``offset[:length]`` of a string or a list: a negative offset counts from the end;
        a negative length is an end counted from the end."""
        parts = spec.split(":", 1)
        offset = self.arith(parts[0], line)
        if offset < 0:
            offset += len(seq)
            if offset < 0:
                return seq[:0]
        if len(parts) == 1:
            return seq[offset:]
        length = self.arith(parts[1], line)
        end = offset + length if length >= 0 else len(seq) + length
        if length < 0 and (isinstance(seq, list) or end < offset):
            raise ShellError(line, f"${{...:{spec}}}: substring expression < 0 (bash stops here too)")
        return seq[offset:end]

    def pattern(self, raw: str, line: int) -> str:
        """A glob word (case pattern, ``[[ x == pattern ]]``) as a regular expression: unquoted ``*``,
        ``?`` and ``[...]`` match, quoted text is literal."""
        out: list[str] = []
        i, n = 0, len(raw)
        while i < n:
            c = raw[i]
            if c == "\\":
                out.append(re.escape(raw[i + 1 : i + 2]))
                i += 2
            elif c == "'":
                j = raw.find("'", i + 1)
                if j < 0:
                    raise ShellError(line, "a single quote (') is never closed")
                out.append(re.escape(raw[i + 1 : j]))
                i = j + 1
            elif c == '"':
                j = skip_quoted(raw, i, line)
                text = "".join(p[0] for p in self.expand_dq(raw[i + 1 : j - 1], line) if p is not None)
                out.append(re.escape(text))
                i = j
            elif c in "$`":
                j, value = self.dollar(raw, i, line)
                text = " ".join(value) if isinstance(value, list) else value
                out.append(fnmatch.translate(text).removeprefix("(?s:").removesuffix(")\\Z"))
                i = j
            elif c == "*":
                out.append(".*")
                i += 1
            elif c == "?":
                out.append(".")
                i += 1
            elif c == "[" and "]" in raw[i + 2 :]:
                j = raw.index("]", i + 2)
                body = raw[i + 1 : j]
                neg = body[:1] in ("!", "^")
                out.append("[" + ("^" if neg else "") + body[1 if neg else 0 :].replace("\\", "\\\\") + "]")
                i = j + 1
            else:
                out.append(re.escape(c))
                i += 1
        return "".join(out)

    def expand_word(self, word: str, line: int) -> str:
        """The word after ``:-`` etc.: quotes removed and expanded, not split."""
        return self.expand(word, line, split=False)[0] if word else ""

    def lookup(self, name: str) -> Value | None:
        """A variable's value; inside a function ``1``, ``2``, ... are the call's arguments."""
        if self.positional and name.isdigit() and name != "0":
            args = self.positional[-1]
            k = int(name) - 1
            return args[k] if k < len(args) else ""
        return self.vars.get(name)

    def get_scalar(self, name: str, line: int) -> str:
        value = self.lookup(name)
        if isinstance(value, Unknown):
            raise _Unresolved(value)
        if name in self.taint:
            self.hits.append(self.taint[name])
        if isinstance(value, list):
            return value[0] if value else ""
        if value is None:
            self.hits.append(Unknown(name, line, f"${name}, which is not set"))
            return ""
        return value

    def get_array(self, name: str, line: int) -> list[str]:
        value = self.vars.get(name)
        if isinstance(value, Unknown):
            raise _Unresolved(value)
        if name in self.taint:
            self.hits.append(self.taint[name])
        if value is None:
            self.hits.append(Unknown(name, line, f"${{{name}[@]}}, which is not set"))
        return value if isinstance(value, list) else [] if value is None else [value]

    def arith(self, expr: str, line: int) -> int:
        """bash ``$(( ))`` on 64-bit integers: + - * / % ** and parentheses; names are variables."""
        if "$(" in expr.replace("$((", "") or "`" in expr:
            why = f"the command substitution in $(({_short(expr)})) (rlzoo runs no commands)"
            raise _Unresolved(Unknown("", line, why))
        if len(expr) > 2000:
            raise ShellError(line, "an arithmetic expression longer than 2000 characters")

        empty: list[str] = []

        def value_of(var: str) -> str:
            text = self.get_scalar(var, line).strip()
            if not text:
                empty.append(var)
                text = "0"
            if not re.fullmatch(r"-?\d+", text):
                raise ShellError(line, f"$(({_short(expr)})): {var}={text!r} is not an integer")
            return f"({text})"

        text = re.sub(
            rf"\$\{{({NAME})\}}|\$({NAME})|\b({NAME})\b",
            lambda m: value_of(next(g for g in m.groups() if g)),
            expr,
        )

        def wrap(x: int) -> int:
            return ((x + 2**63) % 2**64) - 2**63

        def ev(node: ast.AST) -> int:
            if isinstance(node, ast.Expression):
                return ev(node.body)
            if isinstance(node, ast.Constant) and type(node.value) is int:
                return wrap(node.value)
            if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
                left, right = ev(node.left), ev(node.right)
                if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                    why = f" ({', '.join(dict.fromkeys(empty))}: empty or unset here)" if empty else ""
                    raise ShellError(line, f"$(({_short(expr)})): division by zero{why}; bash stops here too")
                if isinstance(node.op, ast.Pow) and not 0 <= right <= 64:
                    raise ShellError(line, f"$(({_short(expr)})): exponent out of range")
                if isinstance(node.op, (ast.Div, ast.FloorDiv)):  # bash truncates toward zero
                    q = abs(left) // abs(right)
                    return wrap(q if (left >= 0) == (right >= 0) else -q)
                if isinstance(node.op, ast.Mod):
                    r = abs(left) % abs(right)
                    return r if left >= 0 else -r
                return wrap(int(_ARITH_OPS[type(node.op)](left, right)))
            if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITH_OPS:
                return wrap(int(_ARITH_OPS[type(node.op)](ev(node.operand))))
            raise ShellError(line, f"$(({_short(expr)})): only + - * / % ** and parentheses on integers")

        try:
            tree = ast.parse(text.strip() or "0", mode="eval")
            return ev(tree)
        except (SyntaxError, ValueError, MemoryError):
            raise ShellError(line, f"$(({_short(expr)})): not integer arithmetic rlzoo reads") from None
        except RecursionError:
            raise ShellError(line, "an arithmetic expression nested too deeply") from None


#: conda and its kin: ``eval "$(conda shell.bash hook)"`` sets the shell up, ``conda activate X`` picks one
_CONDAS = ("conda", "mamba", "micromamba")
_HOOK = re.compile(
    r"""["']?\$\(\s*(?:[\w./~-]*/)?(?:conda|mamba|micromamba)(?:\s+shell(?:\.(?:bash|zsh|posix))?)?"""
    r"""\s+(?:shell\s+)?hook\b[^()`$]*\)["']?"""
)


def _activation(name: str, words: Sequence[Tok]) -> str | None:
    """The command as written when it only sets up or activates a Python environment, else None:
    ``eval "$(conda shell.bash hook)"``, ``conda activate X`` / ``deactivate`` (and mamba, micromamba),
    ``source activate X``, ``source X/bin/activate`` (a venv or conda's old script)."""
    text = " ".join(t.text for t in words)
    args = [t.text for t in words[1:]]
    base = name.rsplit("/", 1)[-1]
    if name == "eval" and len(args) == 1 and _HOOK.fullmatch(args[0]):
        return f"`{_short(text)}`"
    if base in _CONDAS and args[:1] in (["activate"], ["deactivate"]):
        return f"`{_short(text)}`"
    if name in ("source", ".") and args:
        target = args[0].strip("'\"")
        if target in ("activate", "deactivate") or target.endswith(("/bin/activate", "/bin/deactivate")):
            return f"`{_short(text)}`"
    return None


def _date(now: float, fmt: str, utc: bool) -> str | None:
    """GNU ``date +FORMAT`` for the conversions Python's strftime shares with it, plus %N and %s."""
    if re.search(r"%[-_0^#]|%[0-9]|%:", fmt):  # GNU's padding flags and widths: not read
        return None
    stamp = time.gmtime(now) if utc else time.localtime(now)
    fmt = fmt.replace("%N", f"{int((now % 1) * 1e9):09d}").replace("%s", str(int(now)))
    return time.strftime(fmt, stamp)


def _short(text: str) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if text.startswith("`") else f"`{text}`"


def _launch_error(unknown: Sequence[tuple[Unknown, str]]) -> RlzooError:
    """The error for launch arguments that read values rlzoo does not know: each once, with its fix."""
    seen: dict[tuple[str, str], tuple[Unknown, str]] = {}
    for origin, word in unknown:
        seen.setdefault((origin.var, origin.why), (origin, word))

    def what(origin: Unknown, word: str) -> str:
        where = f" (in the launch argument {_short(word)})" if word else ""
        return f"{origin.why} (line {origin.line}){where}"

    items = list(seen.values())
    names = list(dict.fromkeys(o.var for o, _ in items if o.var))
    fix = " ".join(f"--env {n}=VALUE" for n in names)
    if len(items) == 1:
        origin, word = items[0]
        fix = f"pass its value with `{fix}`" if origin.var else "edit the script"
        return RlzooError(f"from-verl: the verl launch reads {what(origin, word)}; {fix}")
    lines = "".join(f"\n  {what(o, w)}" for o, w in items)
    fixes = f"pass their values with `{fix}`" if names else ""
    if len(names) < len(items):
        fixes += (" and " if fixes else "") + "edit the script for the rest"
    return RlzooError(
        f"from-verl: the verl launch reads {len(items)} values rlzoo does not know:{lines}\n{fixes}"
    )


def _assigns_or_launches(pipe: Pipeline, functions: Mapping[str, FuncDef]) -> bool:
    for c in pipe.cmds:
        if not isinstance(c, Simple) or c.assigns:
            return True
        if c.words and c.words[0].text in ("export", "declare", "unset", "local", *functions):
            return True
        if any(re.search(r"python|torchrun|ray", t.text) for t in c.words):
            return True
    return False


class _TestEval:
    """``[ ]`` / ``[[ ]]`` / ``test`` over expanded words: ! && || -a -o ( ), -n -z, = == != =~ < >,
    -eq ... -ge. File tests (-d -f -e ...) depend on the machine the script runs on: refused when
    their answer is needed."""

    _UNARY_FILE = {
        "-a",
        "-b",
        "-c",
        "-d",
        "-e",
        "-f",
        "-g",
        "-h",
        "-k",
        "-p",
        "-r",
        "-s",
        "-t",
        "-u",
        "-w",
        "-x",
        "-L",
        "-S",
        "-O",
        "-G",
        "-N",
        "-v",
    }
    _INT = {
        "-eq": operator.eq,
        "-ne": operator.ne,
        "-lt": operator.lt,
        "-le": operator.le,
        "-gt": operator.gt,
        "-ge": operator.ge,
    }

    def __init__(
        self,
        items: list[tuple[str, Tok]],
        double: bool,
        line: int,
        pattern: Callable[[str, int], str],
    ) -> None:
        self.items, self.double, self.line, self.i = items, double, line, 0
        self.pattern = pattern  # raw word -> regex, for [[ x == pattern ]]

    def run(self) -> bool:
        if not self.items:
            return False
        value = self.or_(True)
        if self.i != len(self.items):
            raise ShellError(self.line, f"cannot read the test at {self.items[self.i][0]!r}")
        return value

    def tok(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.items[j][0] if j < len(self.items) else None

    def or_(self, live: bool) -> bool:
        value = self.and_(live)
        while self.tok() in (("||",) if self.double else ("-o",)):
            self.i += 1
            rhs = self.and_(live and not value)
            value = value or rhs
        return value

    def and_(self, live: bool) -> bool:
        value = self.not_(live)
        while self.tok() in (("&&",) if self.double else ("-a",)) and self.i + 1 < len(self.items):
            self.i += 1
            rhs = self.not_(live and value)
            value = value and rhs
        return value

    def not_(self, live: bool) -> bool:
        if self.tok() == "!" and self.i + 1 < len(self.items):
            self.i += 1
            return not self.not_(live)
        if self.tok() == "(" and self.i + 1 < len(self.items):
            self.i += 1
            value = self.or_(live)
            if self.tok() != ")":
                raise ShellError(self.line, "a ( in a test without its )")
            self.i += 1
            return value
        return self.primary(live)

    def primary(self, live: bool) -> bool:
        a, b, c = self.tok(), self.tok(1), self.tok(2)
        if a is None:
            raise ShellError(self.line, "a test missing an operand")
        binary = {"=", "==", "!=", "=~", "<", ">", *self._INT}
        if b in binary and c is not None:
            self.i += 3
            if b in self._INT:
                try:
                    x, y = int(a), int(c)
                except ValueError:
                    if not live:
                        return False
                    raise ShellError(self.line, f"{a!r} {b} {c!r}: not integers") from None
                return bool(self._INT[b](x, y))
            if b in ("=", "=="):
                return self.match(a, c, self.items[self.i - 1][1])
            if b == "!=":
                return not self.match(a, c, self.items[self.i - 1][1])
            if b == "=~":
                if not self.double:
                    raise ShellError(self.line, "=~ outside [[ ]]")
                try:
                    return re.search(c, a) is not None
                except re.error:
                    raise ShellError(self.line, f"the regular expression {c!r}") from None
            return a < c if b == "<" else a > c
        if a in ("-n", "-z") and b is not None and b not in ("&&", "||", "-a", "-o", ")"):
            self.i += 2
            return bool(b) if a == "-n" else not b
        if a in self._UNARY_FILE and b is not None:
            self.i += 2
            if not live:
                return False
            raise ShellError(
                self.line,
                f"the file test {a} {b!r} depends on the machine the script runs on "
                "(edit a copy of the script to keep the branch your machine takes, or set the variables "
                "it tests with --env so that it is not needed)",
            )
        self.i += 1
        return a != ""

    def match(self, value: str, pattern: str, tok: Tok) -> bool:
        if self.double:  # the right side is a pattern: unquoted * ? [...] match
            return re.fullmatch(self.pattern(tok.text, tok.line), value, re.S) is not None
        return value == pattern


# ---------------------------------------------------------------------------------------------
# launch detection
# ---------------------------------------------------------------------------------------------
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_PY_OPT_WITH_ARG = {"-W", "-X", "-Q"}
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}


def _find_launch(words: Sequence[str | Unknown]) -> tuple[str, int] | None:
    """``(module, index of its first argument)`` when the words run ``python -m`` / ``torchrun``
    (the index is -1 for a python command that runs no verl module); None for any other command."""
    for i, w in enumerate(words):
        if not isinstance(w, str):
            continue
        base = w.rsplit("/", 1)[-1]
        if _PYTHON.fullmatch(base):
            j = i + 1
            while j < len(words) and isinstance(words[j], str) and str(words[j]).startswith("-"):
                opt = str(words[j])
                if opt == "-m" and j + 1 < len(words) and isinstance(words[j + 1], str):
                    module = str(words[j + 1])
                    if module == "torch.distributed.run":
                        return _torchrun(words, j + 2)
                    return (module, j + 2) if _is_verl(module) else (module, -1)
                if opt == "-c":
                    return (opt, -1)
                j += 2 if opt in _PY_OPT_WITH_ARG else 1
            if j < len(words) and isinstance(words[j], str):
                of_file = _module_of_file(str(words[j]))
                return (of_file, j + 1) if of_file else (str(words[j]), -1)
            return ("python", -1)
        if base == "torchrun":
            return _torchrun(words, i + 1)
    return None


def _torchrun(words: Sequence[str | Unknown], j: int) -> tuple[str, int]:
    as_module = False
    while j < len(words) and isinstance(words[j], str) and str(words[j]).startswith("-"):
        opt = str(words[j])
        if opt in ("-m", "--module"):
            as_module = True
            j += 1
        elif opt in _TORCHRUN_FLAGS or "=" in opt:
            j += 1
        else:
            j += 2
    if j >= len(words) or not isinstance(words[j], str):
        return ("torchrun", -1)
    target = str(words[j])
    module = target if as_module else _module_of_file(target)
    return (module, j + 1) if module and _is_verl(module) else (target, -1)


def _is_verl(module: str) -> bool:
    return module.startswith(("verl.", "recipe."))


def _module_of_file(path: str) -> str | None:
    """``verl/trainer/main_ppo.py`` -> ``verl.trainer.main_ppo`` (None for a file outside verl)."""
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    for k, p in enumerate(parts):
        if p in ("verl", "recipe"):
            return ".".join(parts[k:])
    return None


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------
def _bounded(name: str, value: Value, line: int) -> Value:
    """``value``, or an error when it holds more than :data:`MAX_VALUE_CHARS` characters."""
    size = sum(map(len, value)) if isinstance(value, list) else len(value) if isinstance(value, str) else 0
    if size > MAX_VALUE_CHARS:
        raise RlzooError(
            f"from-verl: line {line}: {name} would hold {size:,} characters, more than the "
            f"{MAX_VALUE_CHARS:,} a verl launch script's value may (a value doubled again and again, "
            "e.g. A=$A$A?); nothing was written"
        )
    return value


def read_script(data: bytes, label: str) -> str:
    """The text of a script file, or a clear error for a binary one."""
    if b"\0" in data:
        raise RlzooError(
            f"from-verl: {label} is a binary file (it holds NUL bytes); give a bash launch script"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RlzooError(
            f"from-verl: {label} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); "
            "give a bash launch script"
        ) from None


def parse_script(
    text: str, env: Mapping[str, str] | None = None, fixed: Mapping[str, str] | None = None
) -> Launch:
    """Read a launch script; the first verl launch it runs. ``env``: the environment it starts with
    (default: this process's); ``fixed``: ``--env`` values, which the script's assignments do not change."""
    text = text.replace("\r\n", "\n")
    interp = _Interp(dict(os.environ if env is None else env), dict(fixed or {}))
    try:
        body = parse(text)
        interp.run(body)
    except RecursionError:
        raise ShellError(1, "nesting too deep to read") from None
    except _Unresolved as e:  # a value needed outside a launch (e.g. an array index)
        raise _launch_error([(e.origin, "")]) from None
    if interp.launch is None:
        seen = (
            "; python commands that run no verl module: " + "; ".join(interp.other_python)
            if interp.other_python
            else ""
        )
        raise RlzooError(
            "from-verl: found no verl launch in the script (`python3 -m verl.trainer.main_ppo ...`, "
            "`torchrun ... -m verl...`, `ray job submit ... -- python3 -m ...`)" + seen
        )
    return interp.launch


def parse_command(
    text: str, env: Mapping[str, str] | None = None, fixed: Mapping[str, str] | None = None
) -> Command:
    """Parse a verl launch script into a :class:`Command`."""
    launch = parse_script(text, env, fixed)
    try:
        cmd = parse_overrides(launch.args, module=launch.module)
    except RlzooError as e:
        raise RlzooError(f"{e} (in the verl launch at line {launch.line})") from None
    cmd.notes = list(launch.notes)
    return cmd


def parse_overrides(words: Sequence[str], module: str | None = None) -> Command:
    """verl's command-line words (``key=value``, ``+key=value``, ``--config-name X``) -> :class:`Command`."""
    overrides: list[tuple[str, str]] = []
    config_name = None
    it = iter(words)
    for w in it:
        if w.startswith(("--config-name", "--config-path", "-cn", "-cp")):
            value = w.split("=", 1)[1] if "=" in w else next(it, "")
            if w.startswith(("--config-name", "-cn")):
                config_name = value
            continue
        if w.strip() == "" and w:
            raise RlzooError(
                f"from-verl: cannot read the argument {w!r}: a backslash before a space or a comment "
                "is not a line continuation, so bash passes the space as an argument and ends the "
                "command at that line (delete what follows the backslash)"
            )
        if w.startswith("-") or "=" not in w or w.startswith("~"):
            raise RlzooError(f"from-verl: cannot read the argument {w!r} (expected key=value)")
        key, value = w.split("=", 1)
        overrides.append((key.lstrip("+"), value))
    return Command(module, overrides, config_name)


def parse_value(raw: str) -> Any:
    """A Hydra override value: bool, null, int, float, list, or string."""
    import yaml

    s = raw.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":  # Hydra's quoted string: always a string
        return s[1:-1].replace("\\" + s[0], s[0])
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
