"""Loading a tokenizer the way it declares itself.

``transformers.AutoTokenizer`` (5.x) picks the tokenizer class from the *model's* ``config.json``
when the folder has one, even when ``tokenizer_config.json`` declares a generic fast tokenizer. A
custom ``tokenizers`` tokenizer saved next to, say, a Qwen2 model is then loaded as
``Qwen2Tokenizer``, whose byte-level pre-tokenizer silently drops words of a word-level vocabulary.
:func:`load_tokenizer` honours the declared class: a folder whose ``tokenizer_config.json`` says
``PreTrainedTokenizerFast`` / ``TokenizersBackend`` is loaded with ``PreTrainedTokenizerFast``;
everything else (hub names, real model tokenizers) goes through ``AutoTokenizer`` unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: tokenizer classes that mean "the tokenizer.json as it is", whatever the model type
GENERIC_FAST = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def declared_class(path: str | Path) -> str | None:
    """The ``tokenizer_class`` a local tokenizer folder declares (None for hub names / none)."""
    cfg = Path(path).expanduser() / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        value = json.loads(cfg.read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> Any:
    """A tokenizer from a local folder or hub name, honouring a generic declared class."""
    if declared_class(path) in GENERIC_FAST:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(Path(path).expanduser()))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)


def vocabulary_difference(student: Any, teacher: Any) -> str | None:
    """Where two tokenizers' vocabularies first differ, in words (None: the same id for every token).

    Compares ``get_vocab()`` (added tokens included) id by id, from 0 up: the first id whose token
    differs, or that only one of them has, is named with both tokens.
    """
    by_id_s = {int(i): t for t, i in student.get_vocab().items()}
    by_id_t = {int(i): t for t, i in teacher.get_vocab().items()}
    last = max(max(by_id_s, default=-1), max(by_id_t, default=-1))
    for i in range(last + 1):
        s, t = by_id_s.get(i), by_id_t.get(i)
        if s != t:
            return (
                f"token id {i} is {s!r} in the student's tokenizer but {t!r} in the teacher's "
                f"(vocabularies of {len(by_id_s)} and {len(by_id_t)} tokens)"
            )
    return None
