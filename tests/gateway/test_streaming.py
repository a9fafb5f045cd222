"""Streamed replies (``stream: true``) as the ``openai`` SDK reads them: the same reply, the same record.

An agent that streams gets, reassembled by the SDK, the text and tool calls the same agent gets
without streaming for the same seed, and the run trains on the same samples (ids, log-probs, mask):
streaming changes how a reply is written, never what was sampled or recorded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.test_exactness import CALLS, requests
from gateway.test_tools import _gateway
from rlzoo.kernel.protocols import AgentResult, GenerationRequest, Sample, SamplingParams

openai = pytest.importorskip("openai")


def _api(client: Any) -> Any:
    return openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)


def _chat_loop(stream: bool, seen: list[list[str]], pieces: list[int]) -> Any:
    """The exactness tests' chat loop; ``stream``: every call streamed, read in the SDK's two ways
    (iterating ``create(stream=True)``, and the ``chat.completions.stream`` helper)."""

    def run(client: Any, row: Any) -> AgentResult:
        api = _api(client)
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Count with me: {row['index']}"}]
        texts: list[str] = []
        seen.append(texts)
        for turn in range(CALLS):
            kw: dict[str, Any] = {"model": client.model, "messages": messages, "max_tokens": 40}
            if not stream:
                text = api.chat.completions.create(**kw).choices[0].message.content or ""
            elif turn % 2 == 0:
                parts, usage = [], None
                for chunk in api.chat.completions.create(
                    **kw, stream=True, stream_options={"include_usage": True}
                ):
                    assert chunk.object == "chat.completion.chunk"
                    parts += [c.delta.content or "" for c in chunk.choices]
                    usage = chunk.usage or usage
                text = "".join(parts)
                pieces.append(sum(1 for p in parts if p))
                assert usage is not None and usage.completion_tokens > 0
            else:
                with api.chat.completions.stream(**kw) as events:
                    final = events.get_final_completion()
                text = final.choices[0].message.content or ""
            texts.append(text)
            messages.append({"role": "assistant", "content": text})
            messages.append({"role": "user", "content": f"and then {turn + 1}?"})
        return AgentResult(reward=1.0, final_answer=text)

    return run


def _key(s: Sample) -> tuple[Any, ...]:
    return (s.request_id, s.index, s.prompt_ids, s.response_ids, s.loss_mask)


def _same_log_probs(a: list[Sample], b: list[Sample]) -> bool:
    """The engine's log-probs of the same tokens, to float rounding: the two episodes' calls reach the
    engine at times the machine decides, decoded one at a time or together, and on some CPUs (AVX2)
    a row's fp32 matmul rounds differently in a batch of two than alone (seen: the suite under load)."""
    import torch

    return all(
        torch.allclose(
            torch.tensor(x.rollout_log_probs), torch.tensor(y.rollout_log_probs), atol=1e-5, rtol=0
        )
        for x, y in zip(a, b, strict=True)
    )


def test_a_streamed_chat_loop_gets_the_same_replies_and_trains_the_same_samples(make_gateway: Any) -> None:
    got: dict[bool, tuple[list[list[str]], list[Sample]]] = {}
    pieces: list[int] = []  # content chunks per streamed reply
    for stream in (False, True):
        seen: list[list[str]] = []  # each episode's replies (episodes in any order)
        gw, _ = make_gateway(_chat_loop(stream, seen, pieces))
        samples = gw.generate(requests(1, 2))
        assert all(s.agent["error"] is None and s.agent["turns"] == CALLS for s in samples)  # type: ignore[index]
        assert all(s.agent["gateway"]["splits"] == {} for s in samples)  # type: ignore[index]
        got[stream] = (seen, samples)
    (plain_text, plain), (streamed_text, streamed) = got[False], got[True]
    assert sorted(streamed_text) == sorted(plain_text) and any(t for ts in plain_text for t in ts)
    assert max(pieces) > 1  # the content came token by token, not as one chunk
    assert [_key(s) for s in streamed] == [_key(s) for s in plain]
    assert _same_log_probs(streamed, plain)


def test_streamed_tool_calls_reassemble_to_the_unstreamed_ones(smollm2_tokenizer: Any) -> None:
    """Hermes tool calls (the scripted engine of test_tools): the SDK's stream helper rebuilds the
    same message and tool calls; the tool call id it streamed is the one the tool reply names."""
    tok = smollm2_tokenizer
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    call = 'Let me see. <tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>'
    got: dict[bool, Any] = {}

    class Agent:
        def __init__(self, stream: bool) -> None:
            self.stream = stream

        def run(self, client: Any, row: Any) -> AgentResult:
            from rlzoo.tasks.calc_agent import CALC

            api = _api(client)
            msgs: list[Any] = [{"role": "user", "content": "1+2?"}]
            replies = []
            for _ in range(2):
                kw: dict[str, Any] = {"model": client.model, "messages": msgs, "tools": [CALC]}
                if self.stream:
                    with api.chat.completions.stream(**kw) as events:
                        m = events.get_final_completion().choices[0]
                else:
                    m = api.chat.completions.create(**kw).choices[0]
                replies.append(m)
                msgs.append(m.message.model_dump(exclude_none=True, exclude={"parsed"}))
                for tc in m.message.tool_calls or []:
                    msgs.append({"role": "tool", "tool_call_id": tc.id, "content": "3"})
            got[self.stream] = replies
            return AgentResult(reward=1.0)

    samples = {}
    for stream in (False, True):
        gw, _ = _gateway(tok, eos, [call, "It is 3."], "hermes", Agent(stream), prompt=512, response=200)
        try:
            (samples[stream],) = gw.generate(
                [GenerationRequest("p0", [0], SamplingParams(n=1, max_new_tokens=48), data={})]
            )
        finally:
            gw.shutdown()
        assert samples[stream].agent["error"] is None, samples[stream].agent["error"]  # type: ignore[index]
        assert samples[stream].agent["gateway"]["splits"] == {}  # type: ignore[index]
    for plain, streamed in zip(got[False], got[True]):
        assert streamed.finish_reason == plain.finish_reason
        assert streamed.message.content == plain.message.content
        want = [(t.type, t.function.name, t.function.arguments) for t in plain.message.tool_calls or []]
        have = [(t.type, t.function.name, t.function.arguments) for t in streamed.message.tool_calls or []]
        assert have == want
    first = got[True][0]
    assert first.finish_reason == "tool_calls" and first.message.content == "Let me see."
    (tc,) = first.message.tool_calls
    assert tc.id.startswith("call_") and json.loads(tc.function.arguments) == {"expression": "1+2"}
    assert got[True][1].message.content == "It is 3." and got[True][1].finish_reason == "stop"
    assert _key(samples[True]) == _key(samples[False])
    assert samples[True].rollout_log_probs == samples[False].rollout_log_probs  # a scripted engine: exact


def test_a_streamed_completion_is_the_unstreamed_text(make_gateway: Any) -> None:
    got: dict[str, Any] = {}

    def agent(client: Any, row: Any) -> AgentResult:
        api = _api(client)
        kw = {"model": client.model, "prompt": "Once upon a time", "max_tokens": 12, "logprobs": 1}
        if row["index"] == 0:
            got["plain"] = api.completions.create(**kw).choices[0]
        else:
            chunks = list(api.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
            got["chunks"] = chunks
        return AgentResult(reward=0.0)

    for i in range(2):  # the same seed, episode index and call number: the same sample
        gw, _ = make_gateway(agent)
        sp = SamplingParams(n=1, temperature=1.0, max_new_tokens=200, seed=5)
        (s,) = gw.generate([GenerationRequest("p0", [0], sp, data={"index": i})])
        assert s.agent["error"] is None, s.agent["error"]  # type: ignore[index]
    plain, chunks = got["plain"], got["chunks"]
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.finish_reason
    lps = [
        x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs
    ]
    assert lps == plain.logprobs.token_logprobs
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(lps)


def test_the_wire_format_is_server_sent_events_closed_by_done(make_gateway: Any) -> None:
    """Raw HTTP: ``text/event-stream``, ``data: {json}`` events of one id, the role first, the finish
    reason last, the usage chunk (no choices) after it, then ``data: [DONE]``; the connection stays
    open for the next call."""
    import http.client

    out: dict[str, Any] = {}

    def agent(client: Any, row: Any) -> AgentResult:
        host, path = client.base_url[len("http://") :].split("/", 1)
        name, port = host.split(":")
        conn = http.client.HTTPConnection(name, int(port), timeout=60)
        headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
        body = {
            "model": client.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for k in range(2):  # the same connection twice
            conn.request("POST", f"/{path}/chat/completions", json.dumps(body), headers)
            resp = conn.getresponse()
            out[f"type{k}"] = resp.getheader("Content-Type")
            out[f"raw{k}"] = resp.read().decode()
            body["messages"] = [{"role": "user", "content": "again"}]
        conn.close()
        return AgentResult(reward=0.0)

    gw, _ = make_gateway(agent)
    samples = gw.generate(requests(1, 1))  # two fresh calls: two samples
    assert [s.agent["error"] for s in samples] == [None, None]  # type: ignore[index]
    for k in range(2):
        assert out[f"type{k}"] == "text/event-stream"
        events = out[f"raw{k}"].split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        assert all(e.startswith("data: ") for e in events[:-1])
        chunks = [json.loads(e[len("data: ") :]) for e in events[:-2]]
        assert len({c["id"] for c in chunks}) == 1 and all(
            c["object"] == "chat.completion.chunk" for c in chunks
        )
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
        assert all(c["usage"] is None for c in chunks[:-1])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ],
)
def test_bad_stream_fields_are_refused_with_the_field_named(extra: dict[str, Any], param: str) -> None:
    from rlzoo.gateway.openai_api import ApiError, parse_chat

    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(ApiError) as err:
        parse_chat(body, max_tokens=16, max_n=1)
    assert err.value.status == 400 and err.value.param == param


def test_n_streamed_choices_are_the_unstreamed_choices(make_gateway: Any) -> None:
    """``n=2`` in one call: the chunks, gathered by choice index, are both choices, as without
    streaming (the ``.stream()`` helper refuses a reply cut by ``max_tokens``: raw iteration)."""
    got: dict[bool, list[tuple[str | None, str | None]]] = {}

    def agent(stream: bool) -> Any:
        def run(client: Any, row: Any) -> AgentResult:
            msgs = [{"role": "user", "content": "hi"}]
            kw: dict[str, Any] = {"model": client.model, "messages": msgs, "n": 2, "max_tokens": 10}
            if not stream:
                out = _api(client).chat.completions.create(**kw).choices
                got[stream] = [(c.message.content, c.finish_reason) for c in out]
                return AgentResult(reward=0.0)
            text: dict[int, str] = {}
            finish: dict[int, str | None] = {}
            for chunk in _api(client).chat.completions.create(**kw, stream=True):
                for c in chunk.choices:
                    text[c.index] = text.get(c.index, "") + (c.delta.content or "")
                    finish[c.index] = c.finish_reason or finish.get(c.index)
            got[stream] = [(text[i], finish[i]) for i in sorted(text)]
            return AgentResult(reward=0.0)

        return run

    for stream in (False, True):
        gw, _ = make_gateway(agent(stream))
        samples = gw.generate(requests(1, 1))
        assert [s.agent["error"] for s in samples] == [None, None]  # type: ignore[index]
    assert len(got[True]) == 2 and got[True] == got[False]
