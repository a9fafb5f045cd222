"""Scorers: the math-verify answer table, gsm8k / geo3k / dapo_math / aime hand cases, dispatch."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from math_verify import parse, verify

from rlzoo import get_plugin_manager
from rlzoo.algorithms.functional.scoring import dapo_math, dispatch, extract, geo3k, gsm8k, math_answer
from rlzoo.algorithms.scorers import (
    AIMEParams,
    AutoParams,
    DAPOMathParams,
    Geo3KParams,
    GSM8KParams,
    MathParams,
)

PAIRS_FILE = Path(__file__).parent / "data" / "answer_pairs.jsonl"
PAIRS = [json.loads(line) for line in PAIRS_FILE.read_text().splitlines() if line.strip()]


def _math(response: str, gt: str, **kw) -> dict:
    return math_answer.compute_score(response, gt, "lighteval/MATH", {}, MathParams(**kw))


# ---------------------------------------------------------------------------------------------
# the answer-pair table
# ---------------------------------------------------------------------------------------------
def test_answer_table_is_big_and_covers_every_category():
    assert len(PAIRS) >= 100
    cats = Counter(p["category"] for p in PAIRS)
    for needed in ("fraction", "latex", "units", "interval", "multiple", "negative", "decimal", "wrong"):
        assert cats[needed] >= 4, cats
    # both verdicts are well represented
    assert 30 <= sum(not p["expected"] for p in PAIRS) <= len(PAIRS) - 30


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{i}-{p['category']}" for i, p in enumerate(PAIRS)])
def test_math_scorer_on_answer_table(pair):
    """Expected verdicts are worked out by hand; math-verify's own verdict must agree too."""
    gt, response, expected = pair["ground_truth"], pair["response"], pair["expected"]
    reference = verify(parse("\\boxed{" + gt + "}"), parse(response))
    out = _math(response, gt)
    assert out["acc"] is expected, (gt, response, out)
    assert reference is expected, f"math-verify itself says {reference} for {gt!r} vs {response!r}"
    assert out["score"] == (1.0 if expected else 0.0)


def test_math_agreement_rate_with_math_verify_is_total():
    agree = sum(
        _math(p["response"], p["ground_truth"])["acc"]
        == verify(parse("\\boxed{" + p["ground_truth"] + "}"), parse(p["response"]))
        for p in PAIRS
    )
    assert agree == len(PAIRS)


# ---------------------------------------------------------------------------------------------
# math: extraction conventions and params
# ---------------------------------------------------------------------------------------------
def test_last_boxed_wins_where_math_verify_alone_would_take_another():
    # Deliberate: the last \boxed{} is the answer (verl / Minerva convention).
    assert _math("First \\boxed{3}, then correcting: \\boxed{7}", "7")["acc"] is True
    assert _math("First \\boxed{7}, then correcting: \\boxed{8}", "7")["acc"] is False


def test_fbox_is_read_like_boxed():
    assert _math("\\fbox{12}", "12") == {"score": 1.0, "acc": True, "pred": "12"}


def test_boxed_ground_truth_is_unwrapped():
    assert _math("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}")["acc"] is True


def test_nested_braces_are_balanced():
    assert (
        extract.last_boxed_only_string("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\boxed{\\frac{1}{\\sqrt{2}}}"
    )
    assert extract.last_boxed_only_string("truncated \\boxed{\\frac{1}{2") is None
    assert extract.last_boxed_content("\\boxed 5$") == "5"
    assert extract.last_boxed_content("no box here") is None


def test_format_score_only_for_a_found_but_wrong_answer():
    assert _math("\\boxed{4}", "5", format_score=0.1)["score"] == pytest.approx(0.1)
    assert _math("no answer at all", "5", format_score=0.1, require_boxed=True)["score"] == 0.0
    assert _math("\\boxed{5}", "5", format_score=0.1)["score"] == 1.0


def test_require_boxed_turns_off_fallback():
    assert _math("The final answer is 42", "42")["acc"] is True
    assert _math("The final answer is 42", "42", require_boxed=True)["acc"] is False


def test_fallback_only_searches_the_tail():
    response = "The final answer is 42. " + "blah " * 200
    assert _math(response, "42", fallback_chars=50)["acc"] is False


def test_math_scorer_works_off_the_main_thread():
    """math-verify's signal timeout cannot run in a thread; the scorer turns it off there."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(_math("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}")))
    t.start()
    t.join(60)
    assert out["acc"] is True
    assert math_answer.effective_timeout(5) == 5  # main thread
    assert math_answer.effective_timeout(0) is None


def test_scorer_never_evaluates_model_output(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"\\boxed{{__import__('os').system('touch {marker}')}}"
    _math(evil, "0")
    gsm8k.compute_score(evil, "0", "openai/gsm8k", {}, GSM8KParams(method="flexible"))
    dapo_math.compute_score("Answer: " + evil, "0", "math_dapo", {}, DAPOMathParams())
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# gsm8k
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("response", "method", "expected_pred"),
    [
        ("3 + 4 = 7 so she has 7 apples.\n#### 7", "strict", "7"),
        ("#### 1,234", "strict", "1234"),
        ("#### $18", "strict", None),  # '$' before the number: the strict regex wants a digit
        ("#### -5", "strict", "-5"),
        ("#### 3\nlater: #### 4", "strict", "4"),  # the last one
        ("The answer is 7", "strict", None),  # no '#### '
        ("####7", "strict", None),  # verl wants the space
        ("The answer is 7", "flexible", "7"),
        ("5 apples and 2 more make 7.", "flexible", "7"),  # trailing full stop dropped
        ("It costs 1,000 dollars", "flexible", "1000"),
        ("no numbers here", "flexible", None),
        ("the change is -3", "flexible", "-3"),
    ],
)
def test_gsm8k_extraction(response, method, expected_pred):
    assert gsm8k.extract_solution(response, method) == expected_pred


def test_gsm8k_scores():
    p = GSM8KParams(method="strict", format_score=0.1, score=1.0)
    assert gsm8k.compute_score("#### 72", "72", "openai/gsm8k", {}, p)["score"] == 1.0
    assert gsm8k.compute_score("#### 71", "72", "openai/gsm8k", {}, p)["score"] == pytest.approx(0.1)
    assert gsm8k.compute_score("72", "72", "openai/gsm8k", {}, p)["score"] == 0.0  # no '####'
    flex = GSM8KParams(method="flexible")
    assert gsm8k.compute_score("so 72", "72", "openai/gsm8k", {}, flex) == {
        "score": 1.0,
        "acc": True,
        "pred": "72",
    }
    # only the last 300 characters are searched (verl's clip)
    assert gsm8k.compute_score("#### 72" + " x" * 200, "72", "openai/gsm8k", {}, p)["score"] == 0.0
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", "fuzzy")


# ---------------------------------------------------------------------------------------------
# geo3k
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("response", "gt", "acc", "fmt"),
    [
        ("<think>angles sum to 180</think> The answer is \\boxed{30}", "30", 1.0, 1.0),
        ("<think>hmm</think> \\boxed{31}", "30", 0.0, 1.0),
        ("The answer is \\boxed{30}", "30", 1.0, 0.0),  # no <think>
        ("<think>x</think> the answer is 30", "30", 0.0, 0.0),  # no box: neither
        ("<think>a\nb</think>\n\\boxed{2\\sqrt{3}}\n", "2\\sqrt{3}", 1.0, 1.0),  # DOTALL
        ("<think>x</think> \\boxed{\\frac{1}{2}}", "0.5", 1.0, 1.0),
    ],
)
def test_geo3k_accuracy_and_format(response, gt, acc, fmt):
    out = geo3k.compute_score(response, gt, "hiyouga/geometry3k", {}, Geo3KParams())
    assert out["acc"] is bool(acc)
    assert out["format"] == fmt
    # (1 - 0.1) * acc + 0.1 * format, e.g. acc=1, fmt=1 -> 1.0; acc=0, fmt=1 -> 0.1; acc=1, fmt=0 -> 0.9
    assert out["score"] == pytest.approx(0.9 * acc + 0.1 * fmt)


def test_geo3k_format_weight():
    out = geo3k.compute_score("\\boxed{30}", "30", "hiyouga/geometry3k", {}, Geo3KParams(format_weight=0.5))
    assert out["score"] == pytest.approx(0.5)  # (1 - 0.5) * 1 + 0.5 * 0


# ---------------------------------------------------------------------------------------------
# dapo_math and aime
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("response", "gt", "acc", "pred"),
    [
        ("Let me think.\nAnswer: 18", "18", True, "18"),
        ("Answer: $\\boxed{18}$", "18", True, "18"),
        ("Answer: 1,000", "1000", True, "1000"),
        ("Answer: 30 degrees", "30", True, "30"),
        ("Answer: 30^\\circ", "30", True, "30"),
        ("Answer: \\frac12", "\\frac{1}{2}", True, "\\frac{1}{2}"),
        ("answer: x = 5", "5", True, "5"),
        ("Answer: 17\nAnswer: 18", "17", False, "18"),  # the last Answer: line counts
        ("Answer: 0.5", "\\frac{1}{2}", False, "0.5"),  # string comparison, no math equivalence
        # no Answer: line: verl falls back to the last \boxed{} (raw string comparison)
        ("so the result is \\boxed{5}", "5", True, "5"),
        ("\\boxed{18}", "18", True, "18"),
        ("\\boxed{018}", "18", False, "018"),
        ("\\fbox{18}", "18", False, "[INVALID]"),  # verl's math_dapo knows only \boxed{
        ("no answer here", "18", False, "[INVALID]"),
    ],
)
def test_dapo_math(response, gt, acc, pred):
    out = dapo_math.compute_score(response, gt, "math_dapo", {}, DAPOMathParams())
    assert out == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def test_dapo_math_clips_to_the_tail_and_strict_box():
    long = "Answer: 18\n" + "x" * 400
    assert dapo_math.compute_score(long, "18", "math_dapo", {}, DAPOMathParams())["acc"] is False
    strict = DAPOMathParams(strict_box_verify=True)
    assert dapo_math.compute_score("so \\boxed{18}", "18", "math_dapo", {}, strict)["acc"] is True
    assert dapo_math.compute_score("so \\boxed{018}", "18", "math_dapo", {}, strict)["acc"] is False
    # strict_box_verify: only \boxed{} counts (verl), never \fbox{}, and never an Answer: line
    assert dapo_math.compute_score("so \\fbox{18}", "18", "math_dapo", {}, strict)["acc"] is False
    assert dapo_math.compute_score("Answer: 18", "18", "math_dapo", {}, strict)["acc"] is False


@pytest.mark.parametrize(
    ("response", "acc", "pred"),
    [
        ("Answer: 018", True, "18"),
        ("Answer: 18", True, "18"),
        ("Answer: 18.0", True, "18"),
        ("Answer: $18$.", True, "18"),
        ("work ... \\boxed{18}", True, "18"),
        ("Answer: 19", False, "19"),
        ("Answer: 1018", False, ""),  # out of range
        ("Answer: 18.5", False, ""),
        ("nothing", False, ""),
    ],
)
def test_aime_integer_answers(response, acc, pred):
    out = dapo_math.compute_score_aime(response, "18", "aime24", {}, AIMEParams())
    assert out == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def test_aime_rejects_a_non_integer_ground_truth():
    with pytest.raises(ValueError, match="0-999"):
        dapo_math.compute_score_aime("Answer: 1", "1000", "aime", {}, AIMEParams())


# ---------------------------------------------------------------------------------------------
# dispatch / auto
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("openai/gsm8k", "gsm8k"),
        ("hiyouga/geometry3k", "geo3k"),
        ("math_dapo", "dapo_math"),
        ("BytedTsinghua-SIA/DAPO-Math-17k", "dapo_math"),
        ("BytedTsinghua-SIA/AIME-2024", "dapo_math"),
        ("aime24", "dapo_math"),
        ("aime_2025", "dapo_math"),
        ("lighteval/MATH", "math"),
        ("DigitalLearningGmbH/MATH-lighteval", "math"),
        ("something/else", "math"),  # fallback
    ],
)
def test_dispatch(source, name):
    assert dispatch.dispatch(source) == name


def test_dispatch_routes_and_no_fallback():
    assert dispatch.dispatch("aime24", {"aime24": "aime"}) == "aime"
    with pytest.raises(KeyError, match="routes"):
        dispatch.dispatch("unknown/src", fallback="")


def test_auto_scorer_runs_the_routed_scorer():
    p = AutoParams()
    out = dispatch.compute_score("#### 72", "72", "openai/gsm8k", {}, p)
    assert out["score"] == 1.0 and out["scorer"] == "gsm8k"
    out = dispatch.compute_score("Answer: 5", "5", "aime24", {}, p)
    assert out["score"] == 1.0 and out["scorer"] == "dapo_math"
    out = dispatch.compute_score("Answer: 6", "5", "aime24", {}, p)
    assert out["score"] == -1.0
    out = dispatch.compute_score("\\boxed{1/2}", "\\frac{1}{2}", "lighteval/MATH", {}, p)
    assert out["score"] == 1.0 and out["scorer"] == "math"


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------
def test_scorers_are_registered_with_documented_params():
    reg = get_plugin_manager().registry("scorer")
    for name in ("math", "gsm8k", "geo3k", "dapo_math", "aime", "auto"):
        comp = reg.get(name)
        assert comp.summary, name
        assert callable(comp.load())
        assert all(f["help"] for f in comp.param_fields()), name
        out = comp.load()("\\boxed{1}\nAnswer: 1\n#### 1", "1", "openai/gsm8k", {}, comp.default_params())
        assert isinstance(out, dict) and "score" in out
