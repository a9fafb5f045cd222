"""A word-level tokenizer saved next to a Qwen2 model keeps its own pre-tokenizer when loaded."""

from __future__ import annotations

from pathlib import Path

from rlzoo.data.tokenizer import declared_class, load_tokenizer
from rlzoo.models.tiny import build_tiny_qwen2
from rlzoo.tasks._quickstart import build_tokenizer


def test_generic_tokenizer_next_to_a_qwen2_config(tmp_path: Path) -> None:
    tok = build_tokenizer()
    model, _ = build_tiny_qwen2(tokenizer=tok, num_layers=1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    # the prompt keeps every word, "first" included (AutoTokenizer would load this folder as
    # Qwen2Tokenizer, whose byte-level pre-tokenizer drops the word and gives only the two digits)
    assert declared_class(tmp_path) in {"PreTrainedTokenizerFast", "TokenizersBackend"}
    vocab = tok.get_vocab()
    expected = [vocab["first"], vocab["3"], vocab["7"]]
    assert len(set(expected)) == 3 and tok.unk_token_id not in expected
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode("first 3 7") == tok.encode("first 3 7") == expected
    assert loaded.chat_template == tok.chat_template


def test_hub_names_and_missing_configs_go_through_auto(tmp_path: Path) -> None:
    assert declared_class(tmp_path) is None
    assert declared_class("Qwen/Qwen2.5-0.5B-Instruct") is None
