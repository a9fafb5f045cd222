"""The ``dapo_math`` scorer (verl's math_dapo, Minerva normalisation) and the ``aime`` scorer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...scorers import AIMEParams, DAPOMathParams
from .extract import (
    last_answer_line,
    last_boxed_content,
    last_boxed_only_string,
    remove_boxed,
)

INVALID = "[INVALID]"

# Minerva's normalisation (lm-evaluation-harness hendrycks_math, as verl's math_dapo applies it).
SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
]


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normalisation of a final answer string (verl ``math_dapo.normalize_final_answer``)."""
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    # shorthand TeX: \fracab -> \frac{a}{b}, \sqrta -> \sqrt{a}
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def is_correct_minerva(response: str, ground_truth: str, gt_need_extract: bool = False) -> tuple[bool, str]:
    """``(correct, normalised prediction)`` from the last ``Answer:`` line."""
    line = last_answer_line(response)
    pred = normalize_final_answer(line if line is not None else INVALID)
    if gt_need_extract:
        boxed = last_boxed_only_string(ground_truth)
        ground_truth = remove_boxed(boxed) if boxed is not None else ground_truth
    return pred == normalize_final_answer(ground_truth), pred


def last_braced_box(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None.

    Only the braced ``\\boxed{`` form counts, as in verl's math_dapo (no ``\\fbox``, no
    ``\\boxed x``); an unclosed box is None.
    """
    idx = text.rfind("\\boxed{")
    if idx < 0:
        return None
    start = idx + len("\\boxed")
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def is_correct_strict_box(response: str, ground_truth: str) -> tuple[bool, str | None]:
    """``(correct, prediction)``: the last ``\\boxed{}`` of the last 100 chars equals the ground truth.

    The comparison is of raw strings (no normalisation); the prediction is None without a box.
    """
    pred = last_braced_box(response[-100:])
    return pred == ground_truth, pred


def compute_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: DAPOMathParams
) -> dict[str, Any]:
    """+1.0 when the answer is right, else -1.0 (verl's ``math_dapo.compute_score``).

    The normalised last ``Answer:`` line is compared with the normalised ground truth; without an
    ``Answer:`` line, the last ``\\boxed{}`` of the last 100 characters is compared as a raw
    string (verl's fallback). With ``strict_box_verify`` only that box counts. Returns
    ``{"score", "acc", "pred"}``; ``pred`` is ``[INVALID]`` when nothing was found.
    """
    text = response[-int(params.clip_chars) :]
    gt = str(ground_truth)
    if params.strict_box_verify:
        correct, box = is_correct_strict_box(text, gt)
        pred = box if box is not None else INVALID
    else:
        correct, pred = is_correct_minerva(text, gt)
        if pred == INVALID:
            box_correct, box = is_correct_strict_box(text, gt)
            if box is not None:
                correct, pred = box_correct, box
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


_INTEGER = re.compile(r"^[+-]?\d+(?:\.0*)?$")


def parse_aime_integer(text: str | None) -> int | None:
    """An AIME answer (an integer 0-999) from an answer string, or None.

    ``"018"``, ``"18"``, ``"18.0"``, ``"\\boxed{18}"``, ``"$18$"``, ``"x = 18"`` all give 18.
    """
    if text is None:
        return None
    inner = last_boxed_content(text)
    s = inner if inner is not None else text
    s = s.split("=")[-1]
    s = re.sub(r"\\text\{[^}]*\}|\\[,;!]|[\s$]", "", s).rstrip(".")
    s = s.replace("{", "").replace("}", "")
    if not _INTEGER.match(s):
        return None
    value = int(float(s))
    return value if 0 <= value <= 999 else None


def compute_score_aime(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: AIMEParams
) -> dict[str, Any]:
    """+1.0 when the integer answer (``Answer:`` line, else last ``\\boxed{}``) equals the ground truth.

    Returns ``{"score", "acc", "pred"}``; a missing or out-of-range answer scores -1.0.
    """
    text = response[-int(params.clip_chars) :]
    line = last_answer_line(text)
    pred = parse_aime_integer(line)
    if pred is None:
        pred = parse_aime_integer(last_boxed_content(text))
    gold = parse_aime_integer(str(ground_truth))
    if gold is None:
        raise ValueError(f"AIME ground truth must be an integer 0-999, got {ground_truth!r}")
    correct = pred is not None and pred == gold
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": "" if pred is None else str(pred)}
