"""bash syntax for the launch-script reader: characters -> tokens -> commands (nothing runs here).

:func:`lex` turns characters into words (raw text, quotes kept), operators, redirections and array
assignments, each with its line number; quotes, ``$(...)``, ``${...}``, ``$((...))`` and
backquotes nest; ``\\`` + newline joins lines; ``#`` starts a comment at a word's start; a here-document's
body is passed over as the data it is. The text is lexed as the parser asks for it, so what follows
the launch (even an unclosed quote) is never read.
:class:`Parser` turns tokens into simple commands, ``&&`` / ``||`` lists, pipelines,
``if / elif / else / fi``, ``case ... esac``, ``for NAME in ...; do ...; done`` and function
definitions; :func:`parse` yields the top-level commands one at a time. ``while`` / ``until``
loops, ``for ((...))``, ``{ ...; }`` groups and subshells are a :class:`ShellError` naming the
line.
:mod:`rlzoo_from_verl.shell` gives the commands their meaning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from rlzoo.kernel.errors import RlzooError


class ShellError(RlzooError):
    """The script uses shell that this reader does not follow (never guessed)."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(f"from-verl: unsupported shell construct at line {line}: {what}")
        self.line = line


_MAX_DEPTH = 40
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_OPS = ("&&", "||", ";;", "|&", ";", "&", "|", "(", ")")
_REDIR = re.compile(r"(\d*)(<<<|<<-|<<|<>|>>|>\||<&|>&|&>>|&>|<|>)")


# ---------------------------------------------------------------------------------------------
# 1. lexer
# ---------------------------------------------------------------------------------------------
@dataclass
class Tok:
    kind: str  # "word" | "op" | "redir" | "nl" | "array"
    text: str
    line: int
    items: list[tuple[str, int]] = field(default_factory=list)  # array elements (raw, line)
    eof: bool = False  # the last token: the end of the script


def skip_quoted(s: str, i: int, line: int, depth: int = 0) -> int:
    """Index after the quoted / substituted unit starting at ``s[i]`` (', ", `, $(, $((, ${)."""
    if depth > _MAX_DEPTH:
        raise ShellError(line, "nesting deeper than 40 levels")
    ch = s[i]
    if ch == "'":
        j = s.find("'", i + 1)
        if j < 0:
            raise ShellError(line, "a single quote (') is never closed")
        return j + 1
    if ch == "`":
        j = i + 1
        while j < len(s) and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        if j >= len(s):
            raise ShellError(line, "a backquote (`) is never closed")
        return j + 1
    if ch == '"':
        j = i + 1
        while j < len(s) and s[j] != '"':
            if s[j] == "\\":
                j += 2
            elif s[j] == "`" or (s[j] == "$" and s[j + 1 : j + 2] in ("(", "{")):
                j = skip_quoted(s, j, line, depth + 1)
            else:
                j += 1
        if j >= len(s):
            raise ShellError(line, 'a double quote (") is never closed')
        return j + 1
    # $( $(( ${
    opener, closer = ("{", "}") if s[i + 1] == "{" else ("(", ")")
    level, j = 0, i + 1
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c in "'\"`":
            j = skip_quoted(s, j, line, depth + 1)
            continue
        if c == "$" and s[j + 1 : j + 2] in ("(", "{"):
            j = skip_quoted(s, j, line, depth + 1)
            continue
        if c == opener:
            level += 1
        elif c == closer:
            level -= 1
            if level == 0:
                return j + 1
        j += 1
    raise ShellError(line, f"{s[i : i + 2]!r} is never closed")


def _word_end(src: str, i: int, line: int) -> tuple[int, int]:
    """End index (and line) of the word starting at ``src[i]``: quotes and substitutions nest."""
    n = len(src)
    while i < n:
        c = src[i]
        if c == "\\" and src[i + 1 : i + 2] == "\n":
            i, line = i + 2, line + 1
        elif c == "\\":
            line += src[i + 1 : i + 2] == "\n"
            i += 2
        elif c in "'\"`" or (c == "$" and src[i + 1 : i + 2] in ("(", "{")):
            j = skip_quoted(src, i, line)
            line += src.count("\n", i, j)
            i = j
        elif c in " \t\r\n;&|()<>":
            break
        else:
            i += 1
    return i, line


# an unquoted here-document body is expanded by bash: these forms would set shell variables there
_HEREDOC_ASSIGN = re.compile(r"\$\{" + NAME + r":?=|\$\(\(")


def _heredoc_body(src: str, i: int, line: int, doc: tuple[str, bool, bool, int]) -> tuple[int, int]:
    """Pass over a here-document body starting at ``src[i]``: (index, line) after its delimiter line.
    As bash: a body never closed runs to the end of the script."""
    delim, strip_tabs, quoted, start_line = doc
    body_start = i
    joined = False  # the previous line ended with \ (unquoted body): this line is its continuation
    while i < len(src):
        j = src.find("\n", i)
        j = len(src) if j < 0 else j
        text = src[i:j]
        if not joined and (text.lstrip("\t") if strip_tabs else text) == delim:
            end = j + 1 if j < len(src) else j
            _check_heredoc(src[body_start:i], quoted, start_line)
            return end, line + (j < len(src))
        joined = not quoted and (len(text) - len(text.rstrip("\\"))) % 2 == 1
        i, line = j + 1, line + 1
    _check_heredoc(src[body_start:], quoted, start_line)
    return len(src), line


def _check_heredoc(body: str, quoted: bool, line: int) -> None:
    if not quoted and (m := _HEREDOC_ASSIGN.search(body)):
        raise ShellError(
            line,
            f"a here-document whose body holds {m.group(0)!r}: bash would expand it there, which "
            "may set a variable (quote the delimiter, <<'EOF', if the body is plain data)",
        )


def lex(src: str) -> Iterator[Tok]:
    """Tokens, made as they are asked for; the last is a ``nl`` token with ``eof`` set."""
    i, line, n = 0, 1, len(src)
    heredocs: list[tuple[str, bool, bool, int]] = []  # bodies that start after this line
    while i < n:
        ch = src[i]
        if ch == "\\" and src[i + 1 : i + 2] == "\n":
            i, line = i + 2, line + 1
        elif ch in " \t\r":
            i += 1
        elif ch == "\n":
            yield Tok("nl", "\n", line)
            i, line = i + 1, line + 1
            for doc in heredocs:
                i, line = _heredoc_body(src, i, line, doc)
            heredocs = []
        elif ch == "#":
            while i < n and src[i] != "\n":
                i += 1
        elif m := _REDIR.match(src, i):
            if src[m.end() : m.end() + 1] == "(" and m.group(2) in ("<", ">"):
                raise ShellError(line, f"process substitution {m.group(2)}( ... )")
            i = m.end()
            if m.group(2) in ("<<", "<<-"):
                while i < n and src[i] in " \t":
                    i += 1
                start = i
                i, end_line = _word_end(src, i, line)
                raw = src[start:i]
                if not raw or end_line != line:
                    raise ShellError(line, f"a here-document ({m.group(0)}) without a delimiter word")
                quoted = any(q in raw for q in "'\"\\")
                delim = re.sub(r"\\(.)|['\"]", r"\1", raw)
                heredocs.append((delim, m.group(2) == "<<-", quoted, line))
                yield Tok("redir", m.group(0), line)
                yield Tok("word", raw, line)
            else:
                yield Tok("redir", m.group(0), line)
        elif ch in ";&|()":
            op = next(o for o in _OPS if src.startswith(o, i))
            yield Tok("op", op, line)
            i += len(op)
        else:
            start, start_line = i, line
            i, line = _word_end(src, i, line)
            raw = src[start:i].replace("\\\n", "")
            if i < n and src[i] == "(" and re.fullmatch(NAME + r"\+?=", raw):
                items, i, line = _lex_array(src, i + 1, line)
                yield Tok("array", raw, start_line, items)
            elif i < n and src[i] in "<>" and raw.isdigit():
                i = start  # a numbered redirection (2>&1): read again as one
                m2 = _REDIR.match(src, start)
                assert m2 is not None
                if m2.group(2) in ("<<", "<<-"):
                    raise ShellError(start_line, f"a here-document on descriptor {raw}")
                yield Tok("redir", m2.group(0), start_line)
                i = m2.end()
            else:
                yield Tok("word", raw, start_line)
    yield Tok("nl", "\n", line, eof=True)


class _Tokens:
    """The lexer's tokens as a list that is filled only as far as the parser reads."""

    def __init__(self, src: str) -> None:
        self._gen = lex(src)
        self._buf: list[Tok] = []

    def __getitem__(self, k: int) -> Tok:
        while len(self._buf) <= k and not (self._buf and self._buf[-1].eof):
            self._buf.append(next(self._gen))
        return self._buf[min(k, len(self._buf) - 1)]


def _lex_array(src: str, i: int, line: int) -> tuple[list[tuple[str, int]], int, int]:
    """The elements of ``NAME=( ... )`` (newlines and comments allowed inside)."""
    sub: list[tuple[str, int]] = []
    start_line = line
    while True:
        while i < len(src) and src[i] in " \t\r\n":
            line += src[i] == "\n"
            i += 1
        if i >= len(src):
            raise ShellError(start_line, "an array ( ... ) is never closed")
        if src[i] == ")":
            return sub, i + 1, line
        if src[i] == "#":
            while i < len(src) and src[i] != "\n":
                i += 1
            continue
        if src[i] in ";&|(<>":
            raise ShellError(line, f"{src[i]!r} inside an array ( ... )")
        start, wline = i, line
        while i < len(src) and src[i] not in " \t\r\n;&|()<>":
            if src[i] == "\\":
                line += src[i + 1 : i + 2] == "\n"
                i += 2
            elif src[i] in "'\"`" or (src[i] == "$" and src[i + 1 : i + 2] in ("(", "{")):
                j = skip_quoted(src, i, line)
                line += src.count("\n", i, j)
                i = j
            else:
                i += 1
        sub.append((src[start:i].replace("\\\n", ""), wline))


# ---------------------------------------------------------------------------------------------
# 2. parser
# ---------------------------------------------------------------------------------------------
@dataclass
class Simple:
    line: int
    assigns: list[Tok]  # word tokens NAME=... / NAME+=... and array tokens
    words: list[Tok]


@dataclass
class Pipeline:
    line: int
    negate: bool
    cmds: list[Simple | If | Case | FuncDef | For]


@dataclass
class AndOr:
    line: int
    items: list[tuple[str, Pipeline]]  # (connector before it: "" | "&&" | "||", pipeline)


@dataclass
class If:
    line: int
    clauses: list[tuple[list[AndOr], list[AndOr]]]  # (condition, body)
    orelse: list[AndOr] | None


@dataclass
class Case:
    line: int
    word: Tok
    items: list[tuple[list[Tok], list[AndOr]]]  # (patterns, body)


@dataclass
class FuncDef:
    line: int
    name: str
    body: list[AndOr]


@dataclass
class For:
    line: int
    var: str
    words: list[Tok] | None  # None: `for NAME; do` (the arguments, "$@")
    body: list[AndOr]


ASSIGN = re.compile(rf"({NAME})(\+?)=")
_LOOP_HINT = "rlzoo cannot know how often it runs; edit a copy of the script"
_REFUSED_WORDS = {
    "while": f"a while loop: {_LOOP_HINT}",
    "until": f"an until loop: {_LOOP_HINT}",
    "select": "a select loop (it reads the terminal)",
    "{": "a { ... } group",
    "}": "a { ... } group",
    "do": "'do' outside a for loop",
    "done": "'done' outside a for loop",
    "esac": "a case end",
}
_RESERVED_END = {"then", "elif", "else", "fi"}


class Parser:
    def __init__(self, src: str) -> None:
        self.toks, self.i = _Tokens(src), 0

    def peek(self) -> Tok:
        return self.toks[self.i]

    def at_word(self, *words: str) -> bool:
        t = self.peek()
        return t.kind == "word" and t.text in words

    def skip_newlines(self) -> None:
        while self.peek().kind == "nl" or (self.peek().kind == "op" and self.peek().text == ";"):
            if self.peek().eof:
                return
            self.i += 1

    def parse_one(self) -> list[AndOr]:
        """The next top-level command (with what ends it)."""
        t = self.peek()
        if t.kind == "word" and t.text in _RESERVED_END:
            raise ShellError(t.line, f"{t.text!r} without a matching if")
        ao = self.and_or()
        t = self.peek()
        if t.kind == "op" and t.text == "&":
            self.i += 1
        elif t.kind == "op" and t.text == ";;":
            raise ShellError(t.line, "';;' outside a case statement")
        elif t.kind != "nl" and not (t.kind == "op" and t.text == ";"):
            raise ShellError(t.line, f"unexpected {t.text!r}")
        return [ao]

    def parse_list(self, stops: set[str]) -> list[AndOr]:
        out: list[AndOr] = []
        while True:
            self.skip_newlines()
            t = self.peek()
            if t.eof:
                if stops:
                    raise ShellError(t.line, f"the script ends before {' / '.join(sorted(stops))}")
                return out
            if (t.kind == "word" or t.text == ";;") and t.text in stops:
                return out
            if t.kind == "word" and t.text in _RESERVED_END:
                raise ShellError(t.line, f"{t.text!r} without a matching if")
            out.append(self.and_or())
            t = self.peek()
            if t.kind == "op" and t.text == "&":
                self.i += 1  # background: read it as if it ran in order
            elif t.kind == "op" and t.text == ";;":
                if ";;" in stops:
                    return out
                raise ShellError(t.line, "';;' outside a case statement")
            elif (
                t.kind != "nl"
                and not (t.kind == "op" and t.text == ";")
                and not (t.kind == "word" and t.text in stops)
            ):
                raise ShellError(t.line, f"unexpected {t.text!r}")

    def and_or(self) -> AndOr:
        line = self.peek().line
        items = [("", self.pipeline())]
        while self.peek().kind == "op" and self.peek().text in ("&&", "||"):
            op = self.peek().text
            self.i += 1
            while self.peek().kind == "nl" and not self.peek().eof:
                self.i += 1
            items.append((op, self.pipeline()))
        return AndOr(line, items)

    def pipeline(self) -> Pipeline:
        line = self.peek().line
        negate = False
        if self.at_word("!"):
            negate, self.i = True, self.i + 1
        cmds = [self.command()]
        while self.peek().kind == "op" and self.peek().text in ("|", "|&"):
            self.i += 1
            while self.peek().kind == "nl" and not self.peek().eof:
                self.i += 1
            cmds.append(self.command())
        return Pipeline(line, negate, cmds)

    def command(self) -> Simple | If | Case | FuncDef | For:
        t = self.peek()
        if t.kind == "word" and t.text == "if":
            return self.if_()
        if t.kind == "word" and t.text == "for":
            return self.for_()
        if t.kind == "word" and t.text == "case":
            return self.case()
        if t.kind == "word" and t.text == "function":
            self.i += 1
            name = self.peek()
            if name.kind != "word" or not re.fullmatch(r"[\w.:-]+", name.text):
                raise ShellError(t.line, "`function` without a name")
            self.i += 1
            if self.peek().kind == "op" and self.peek().text == "(":
                self.expect_op(")", after="(")
            return self.function_body(name)
        nxt = self.toks[self.i + 1]
        if t.kind == "word" and nxt.kind == "op" and nxt.text == "(":
            self.i += 1
            self.expect_op(")", after="(")
            return self.function_body(t)
        if t.kind == "word" and t.text in _REFUSED_WORDS:
            raise ShellError(t.line, f"{_REFUSED_WORDS[t.text]} ({t.text!r})")
        if t.kind == "op" and t.text == "(":
            raise ShellError(t.line, "a subshell or arithmetic command ( ... )")
        if t.kind == "op" or t.kind == "nl":
            raise ShellError(t.line, f"expected a command, found {t.text.strip() or 'end of line'!r}")
        cmd = Simple(t.line, [], [])
        in_test = False
        while True:
            t = self.peek()
            if t.kind == "nl":
                if in_test:
                    raise ShellError(t.line, "a [[ test is never closed with ]]")
                break
            if in_test:  # inside [[ ]]: && || ( ) < > are the test's own operators
                cmd.words.append(Tok("word", t.text, t.line) if t.kind != "word" else t)
                self.i += 1
                if t.kind == "word" and t.text == "]]":
                    in_test = False
                continue
            if t.kind == "op":
                if t.text == "(":
                    raise ShellError(
                        t.line, f"'(' after {cmd.words[-1].text if cmd.words else 'an assignment'!r}"
                    )
                break
            if t.kind == "redir":
                self.i += 1
                nxt = self.peek()
                if nxt.kind != "word":
                    raise ShellError(t.line, f"redirection {t.text!r} without a target")
                self.i += 1
                continue
            if t.kind == "array":
                if cmd.words and cmd.words[0].text not in (
                    "export",
                    "declare",
                    "typeset",
                    "local",
                    "readonly",
                ):
                    raise ShellError(t.line, f"an array assignment as an argument of {cmd.words[0].text!r}")
                (cmd.words if cmd.words else cmd.assigns).append(t)
                self.i += 1
                continue
            if not cmd.words and ASSIGN.match(t.text):
                cmd.assigns.append(t)
            else:
                if not cmd.words and t.text in _RESERVED_END | {"if", "for"} | set(_REFUSED_WORDS):
                    break
                cmd.words.append(t)
                if len(cmd.words) == 1 and t.text == "[[":
                    in_test = True
            self.i += 1
        return cmd

    def if_(self) -> If:
        line = self.peek().line
        clauses: list[tuple[list[AndOr], list[AndOr]]] = []
        orelse: list[AndOr] | None = None
        self.i += 1  # if
        while True:
            cond = self.parse_list({"then"})
            self.i += 1  # then
            body = self.parse_list({"elif", "else", "fi"})
            clauses.append((cond, body))
            word = self.peek().text
            self.i += 1
            if word == "elif":
                continue
            if word == "else":
                orelse = self.parse_list({"fi"})
                self.i += 1
            break
        return If(line, clauses, orelse)

    def for_(self) -> For:
        line = self.peek().line
        self.i += 1  # for
        t = self.peek()
        if t.kind == "op" and t.text == "(":
            raise ShellError(line, f"an arithmetic for loop `for (( ... ))`: {_LOOP_HINT}")
        if t.kind != "word" or not re.fullmatch(NAME, t.text):
            raise ShellError(line, "`for` without a variable name")
        var = t.text
        self.i += 1
        while self.peek().kind == "nl" and not self.peek().eof:
            self.i += 1
        words: list[Tok] | None = None
        if self.at_word("in"):
            self.i += 1
            words = []
            while self.peek().kind == "word":
                words.append(self.peek())
                self.i += 1
        t = self.peek()
        if not (t.kind == "nl" or (t.kind == "op" and t.text == ";")):
            raise ShellError(t.line, f"unexpected {t.text!r} in the for loop's list")
        self.skip_newlines()
        if not self.at_word("do"):
            raise ShellError(self.peek().line, "`for ...` without `do`")
        self.i += 1
        body = self.parse_list({"done"})
        self.i += 1  # done
        return For(line, var, words, body)

    def expect_op(self, op: str, after: str) -> None:
        """Consume ``after`` (the current token) and then ``op``."""
        self.i += 1
        t = self.peek()
        if t.kind != "op" or t.text != op:
            raise ShellError(
                t.line, f"expected {op!r} after {after!r}, found {t.text.strip() or 'end of line'!r}"
            )
        self.i += 1

    def function_body(self, name: Tok) -> FuncDef:
        """``{ list; }`` after ``name()`` / ``function name``."""
        while self.peek().kind == "nl" and not self.peek().eof:
            self.i += 1
        t = self.peek()
        if not (t.kind == "word" and t.text == "{"):
            raise ShellError(t.line, f"a function body other than {{ ... }} for {name.text!r}")
        self.i += 1
        body = self.parse_list({"}"})
        self.i += 1  # }
        return FuncDef(name.line, name.text, body)

    def case(self) -> Case:
        line = self.peek().line
        self.i += 1  # case
        word = self.peek()
        if word.kind != "word":
            raise ShellError(line, "`case` without a word")
        self.i += 1
        while self.peek().kind == "nl" and not self.peek().eof:
            self.i += 1
        if not self.at_word("in"):
            raise ShellError(self.peek().line, "`case WORD` without `in`")
        self.i += 1
        items: list[tuple[list[Tok], list[AndOr]]] = []
        while True:
            self.skip_newlines()
            t = self.peek()
            if t.kind == "word" and t.text == "esac":
                self.i += 1
                return Case(line, word, items)
            if t.eof:
                raise ShellError(line, "a case statement without esac")
            if t.kind == "op" and t.text == "(":
                self.i += 1
            patterns: list[Tok] = []
            while True:
                t = self.peek()
                if t.kind != "word":
                    raise ShellError(
                        t.line, f"a case pattern expected, found {t.text.strip() or 'end of line'!r}"
                    )
                patterns.append(t)
                self.i += 1
                t = self.peek()
                if t.kind == "op" and t.text == "|":
                    self.i += 1
                    continue
                if t.kind == "op" and t.text == ")":
                    self.i += 1
                    break
                raise ShellError(
                    t.line, f"a case pattern must end with ')', found {t.text.strip() or 'end of line'!r}"
                )
            body = self.parse_list({";;", "esac"})
            items.append((patterns, body))
            if self.peek().kind == "op" and self.peek().text == ";;":
                self.i += 1


def parse(text: str) -> Iterator[AndOr]:
    """The script's top-level commands, in order, each read when the one before it has run (as bash
    reads a script): a construct this parser refuses after the launch never stops the reader."""
    p = Parser(text)
    while True:
        p.skip_newlines()
        if p.peek().eof:
            return
        yield from p.parse_one()
