"""The ``example_keyword`` scorer (imported only when the part is used)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .plugin import KeywordParams


def keyword_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: KeywordParams
) -> dict[str, Any]:
    """1.0 when ``params.keyword`` appears in the response, else 0.0 (the ground truth is ignored)."""
    keyword = params.keyword
    text = response or ""
    if not params.case_sensitive:
        keyword, text = keyword.lower(), text.lower()
    found = bool(keyword) and keyword in text
    return {"score": 1.0 if found else 0.0, "found": found}
