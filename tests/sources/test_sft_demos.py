"""Demonstrations laid out as the multi-turn rollout lays out a trajectory: the loss mask by hand on a
two-turn chat with a tool call (tool_arithmetic's word-level tokenizer: one token per word)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlzoo.agents.chat import ChatTemplate
from rlzoo.sources.demos import DemoError, read_conversations, render, write_conversations
from rlzoo.tasks._tools import build_tokenizer

CHAT = [
    {"role": "user", "content": "4 5 6 + 7 8 9 = ? ? ? ?"},
    {"role": "assistant", "content": "calc 4 5 6 + 7 8 9"},
    {"role": "tool", "name": "calc", "content": "4 5 6 + 7 8 9 = 1 2 4 5"},
    {"role": "assistant", "content": "Answer: 4 5 6 + 7 8 9 = 1 2 4 5"},
]


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    tok = build_tokenizer()
    return ChatTemplate(tok, stop_ids=[tok.convert_tokens_to_ids("<eos>")])


def ids(template: ChatTemplate, words: str) -> list[int]:
    return [int(template.tokenizer.convert_tokens_to_ids(w)) for w in words.split()]


def test_two_turn_chat_with_a_tool_call_by_hand(template: ChatTemplate) -> None:
    prompt, response, mask = render(template, CHAT)
    # the template: "<|role|> content " per message, "<eos> " after an assistant's, and
    # "<|assistant|>" as the generation prompt
    assert prompt == ids(template, "<|user|> 4 5 6 + 7 8 9 = ? ? ? ? <|assistant|>")
    call = "calc 4 5 6 + 7 8 9 <eos>"  # 9 tokens, trained (the model's stop token too)
    reply = "<|tool|> 4 5 6 + 7 8 9 = 1 2 4 5 <|assistant|>"  # 14 tokens: the tool's delta, not trained
    answer = "Answer: 4 5 6 + 7 8 9 = 1 2 4 5 <eos>"  # 14 tokens, trained
    assert response == ids(template, f"{call} {reply} {answer}")
    assert mask == [1] * 9 + [0] * 14 + [1] * 14


def test_the_layout_is_the_rollouts(template: ChatTemplate) -> None:
    """Prompt = prompt_ids(reset's messages); the tool reply = delta_ids after the first turn, as
    rlzoo.agents.rollout appends an observation."""
    prompt, response, _ = render(template, CHAT)
    assert prompt == template.prompt_ids(CHAT[:1])
    delta = template.delta_ids(CHAT[:2], CHAT[2:3])
    assert response[9 : 9 + len(delta)] == delta


def test_messages_after_the_last_assistant_turn_are_dropped(template: ChatTemplate) -> None:
    a = render(template, CHAT)
    b = render(template, [*CHAT, {"role": "user", "content": "4"}])
    assert a == b


def test_prompt_response_rows_and_bad_rows(template: ChatTemplate, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "pr.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1 + 2", "response": "Answer: 3"}]), path)
    ((messages, _),) = read_conversations(
        [path], messages_key="messages", prompt_key="prompt", response_key="response"
    )
    prompt, response, mask = render(template, messages)
    assert prompt == ids(template, "<|user|> 1 + 2 <|assistant|>")
    assert response == ids(template, "Answer: 3 <eos>") and mask == [1, 1, 1]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "x"}]), bad)
    with pytest.raises(DemoError, match="'messages' column"):
        read_conversations([bad], messages_key="messages", prompt_key="prompt", response_key="response")
    with pytest.raises(DemoError, match="at least one assistant"):
        render(template, CHAT[:1])


def test_written_demonstrations_read_back_and_no_file_is_replaced(
    template: ChatTemplate, tmp_path: Path
) -> None:
    path = tmp_path / "demos.parquet"
    write_conversations(path, [(CHAT, {"data_source": "t", "extra_info": {"a": 456}})])
    ((messages, data),) = read_conversations(
        [path], messages_key="messages", prompt_key="prompt", response_key="response"
    )
    assert render(template, messages) == render(template, CHAT)
    assert data["data_source"] == "t"
    with pytest.raises(DemoError, match="exists"):
        write_conversations(path, [(CHAT, {})])
