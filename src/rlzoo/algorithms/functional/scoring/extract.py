"""Answer extraction shared by the scorers. Pure string functions; nothing is ever evaluated."""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed x``) in ``text``, braces balanced.

    Returns the whole command (``"\\boxed{\\frac{1}{2}}"``), or None when there is none or its
    braces never close (a truncated response).
    """
    idx = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if idx < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, idx))
    rest = text[idx + len(cmd) :]
    if rest.startswith(" "):  # "\boxed 5": the argument is the next word
        word = rest[1:].split("$")[0].split()
        return f"{cmd} {word[0]}" if word else None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[idx : idx + len(cmd) + i + 1]
        elif depth == 0 and not ch.isspace():
            return None  # "\boxed" not followed by an argument
    return None


def remove_boxed(boxed: str) -> str:
    """The argument of a ``\\boxed{...}`` / ``\\boxed x`` string from :func:`last_boxed_only_string`."""
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1 :]
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1 : -1]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def last_boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed{}`` in ``text``, or None."""
    boxed = last_boxed_only_string(text)
    return remove_boxed(boxed) if boxed is not None else None


ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def last_answer_line(text: str, pattern: re.Pattern[str] = ANSWER_LINE) -> str | None:
    """The text after the last ``Answer:`` (case-insensitive) up to the end of its line, or None."""
    found = pattern.findall(text)
    return found[-1] if found else None
