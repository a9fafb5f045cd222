"""The native rollout engine on a tiny random Qwen2 (fp32, CPU).

References are computed independently of the engine: a plain full forward of the model over
``prompt + tokens so far`` (no cache, no padding, batch of one) at every step.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from rlzoo.backends.native.engine import NativeEngine, inverse_cdf_draw
from rlzoo.backends.native.rollout import NativeRolloutBackend
from rlzoo.backends.native.rollout_params import NativeRolloutParams
from rlzoo.kernel.protocols import GenerationRequest, RolloutBackend, SamplingParams
from rlzoo.kernel.settings import RolloutSpec
from rlzoo.models.tiny import tiny_qwen2_config

transformers = pytest.importorskip("transformers")

VOCAB = 96


def _tiny(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    cfg = tiny_qwen2_config(VOCAB, hidden_size=64, max_position_embeddings=256)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return _tiny(0)


@pytest.fixture(scope="module")
def other_model() -> nn.Module:
    return _tiny(1)


def _prompts(count: int, seed: int = 0, max_len: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (count,), generator=g).tolist()
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _req(rid: str, prompt: list[int], **sampling) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_ids=prompt, sampling=SamplingParams(**sampling))


@torch.no_grad()
def _full_logits(model: nn.Module, tokens: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([tokens])).logits[0].float()  # [L, V]


def _reference_greedy(
    model: nn.Module, prompt: list[int], max_new: int, stop: tuple[int, ...] = ()
) -> list[int]:
    out: list[int] = []
    while len(out) < max_new:
        tok = int(_full_logits(model, prompt + out)[-1].argmax())
        out.append(tok)
        if tok in stop:
            break
    return out


def _engine(model: nn.Module, **kw) -> NativeEngine:
    return NativeEngine(model, **kw)


# ---------------------------------------------------------------------------------------------
# correctness of continuous batching
# ---------------------------------------------------------------------------------------------
def test_continuous_batching_greedy_equals_one_at_a_time(model):
    prompts = _prompts(10, seed=1)
    max_new = [3, 17, 1, 9, 25, 4, 12, 2, 20, 6]  # long and short mixed: slots free up and refill
    reqs = [_req(f"r{i}", p, greedy=True, max_new_tokens=m) for i, (p, m) in enumerate(zip(prompts, max_new))]
    reqs.append(_req("n3", prompts[0], greedy=True, max_new_tokens=7, n=3))  # one shared prefill, 3 rows
    engine = _engine(model, max_num_seqs=3)
    batched = engine.generate(reqs)
    assert engine.stats["prefill_forwards"] > 1  # sequences did join a running batch
    chunked = _engine(model, max_num_seqs=5, max_prefill_tokens=16).generate(reqs)  # joins in chunks
    assert [s.uid for s in batched] == [f"r{i}/0" for i in range(10)] + ["n3/0", "n3/1", "n3/2"]
    for sample, other in zip(batched, chunked):
        req = reqs[int(sample.request_id[1:])] if sample.request_id != "n3" else reqs[-1]
        alone = _engine(model, max_num_seqs=1).generate([req])[sample.index]
        reference = _reference_greedy(model, req.prompt_ids, req.sampling.max_new_tokens)
        assert sample.response_ids == other.response_ids == alone.response_ids == reference
        assert sample.finish_reason == "length"
        assert sample.prompt_ids == req.prompt_ids


def test_log_probs_match_full_forward(model):
    temperature = 0.7
    reqs = [
        _req(f"r{i}", p, temperature=temperature, top_k=20, top_p=0.9, max_new_tokens=10, n=2)
        for i, p in enumerate(_prompts(4, seed=2))
    ]
    samples = _engine(model, max_num_seqs=3).generate(reqs)
    assert len(samples) == 8
    for s in samples:
        logits = _full_logits(model, s.prompt_ids + s.response_ids)  # [L, V]
        p = len(s.prompt_ids)
        # log_softmax(logits / T) of the sampled token, at the positions that predicted it
        expected = (logits[p - 1 : -1] / temperature).log_softmax(-1)  # [R, V]
        expected = expected.gather(-1, torch.tensor(s.response_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs), expected, atol=1e-5, rtol=0)


def test_n_samples_per_request(model):
    prompt = _prompts(1, seed=3)[0]
    samples = _engine(model).generate([_req("a", prompt, n=4, max_new_tokens=8, temperature=1.0, seed=5)])
    assert [s.index for s in samples] == [0, 1, 2, 3]
    assert {s.uid for s in samples} == {"a/0", "a/1", "a/2", "a/3"}
    assert all(s.prompt_ids == prompt and len(s.response_ids) == 8 for s in samples)
    assert len({tuple(s.response_ids) for s in samples}) > 1  # independent draws, not copies
    assert all(s.versions == [0] * 8 and len(s.rollout_log_probs) == 8 for s in samples)


def test_stop_on_eos_and_on_max_tokens(model):
    prompt = _prompts(1, seed=4)[0]
    greedy = _reference_greedy(model, prompt, 12)
    eos = greedy[3]
    stop_at = greedy.index(eos)  # first occurrence (index <= 3)
    engine = _engine(model, eos_token_ids=(eos,), max_response_length=10)
    by_eos, by_len, by_req_stop, capped = engine.generate(
        [
            _req("eos", prompt, greedy=True, max_new_tokens=12),
            _req("len", prompt, greedy=True, max_new_tokens=stop_at),  # ends just before the EOS
            _req("stop_ids", prompt, greedy=True, max_new_tokens=12, stop_token_ids=(greedy[0],)),
            _req("cap", [eos + 1 if eos + 1 < VOCAB else 0], greedy=True, max_new_tokens=50),
        ]
    )
    assert by_eos.response_ids == greedy[: stop_at + 1] and by_eos.finish_reason == "stop"
    assert by_len.response_ids == greedy[:stop_at] and by_len.finish_reason == "length"
    assert by_req_stop.response_ids == greedy[:1] and by_req_stop.finish_reason == "stop"
    # max_response_length=10 caps max_new_tokens=50
    assert len(capped.response_ids) <= 10
    assert capped.finish_reason == ("stop" if capped.response_ids[-1] == eos else "length")


def test_top_k_one_equals_greedy(model):
    prompts = _prompts(3, seed=5)
    greedy = _engine(model).generate(
        [_req(f"r{i}", p, greedy=True, max_new_tokens=10) for i, p in enumerate(prompts)]
    )
    top1 = _engine(model).generate(
        [_req(f"r{i}", p, temperature=1.3, top_k=1, max_new_tokens=10) for i, p in enumerate(prompts)]
    )
    assert [s.response_ids for s in top1] == [s.response_ids for s in greedy]


def test_inverse_cdf_draw_picks_by_cumulative_probability():
    """softmax([log .25, -inf, log .5, log .25]) = [.25, 0, .5, .25]; the CDF [.25, .25, .75, 1]: u
    picks the first token whose cumulative probability exceeds u; the 0-probability token never."""
    logits = torch.tensor([0.25, 0.0, 0.5, 0.25]).log().expand(7, 4)
    u = torch.tensor([0.0, 0.2, 0.25, 0.5, 0.75, 0.9, 1 - 1e-17], dtype=torch.float64)
    assert inverse_cdf_draw(logits, u).tolist() == [0, 0, 2, 2, 3, 3, 3]
    top_two = torch.tensor([[0.0, 1.0, float("-inf"), float("-inf")]])  # the last tokens filtered out
    assert inverse_cdf_draw(top_two, torch.tensor([1 - 1e-17], dtype=torch.float64)).tolist() == [1]


def test_sampled_tokens_follow_the_softmax(model):
    """2,000 one-token samples of a prompt at temperature 0.05 (9 tokens above 1%): their
    frequencies match softmax(logits / 0.05) of a plain forward. Total variation < 0.07: exact
    multinomial draws of 2,000 stay below 0.057 in 99.5% of 200 trials (median 0.032); a sampler
    that ignored the temperature or shifted a token id would be far off."""
    prompt = _prompts(1, seed=9)[0]
    n, temp = 2000, 0.05
    out = _engine(model, max_num_seqs=512).generate(
        [_req("r", prompt, n=n, temperature=temp, max_new_tokens=1)]
    )
    toks = torch.tensor([s.response_ids[0] for s in out])
    want = (_full_logits(model, prompt)[-1] / temp).double().softmax(-1)
    assert 0.5 * (torch.bincount(toks, minlength=VOCAB).double() / n - want).abs().sum() < 0.07
    lp = torch.tensor([s.rollout_log_probs[0] for s in out])  # of the full distribution
    torch.testing.assert_close(lp, want.log()[toks].float(), atol=1e-4, rtol=1e-5)


def test_same_seed_same_samples(model):
    reqs = [
        _req(f"r{i}", p, n=2, temperature=1.0, top_p=0.95, max_new_tokens=12)
        for i, p in enumerate(_prompts(5, 6))
    ]

    def run(seed: int, slots: int) -> list[list[int]]:
        return [s.response_ids for s in _engine(model, seed=seed, max_num_seqs=slots).generate(reqs)]

    first = run(7, 4)
    assert run(7, 4) == first
    assert run(7, 10) == first  # a sequence's draws do not depend on who shares the batch
    assert run(8, 4) != first
    # a request seed fixes its samples whatever the engine's submission history
    seeded = _req("s", reqs[0].prompt_ids, n=2, temperature=1.0, max_new_tokens=12, seed=3)
    engine = _engine(model, seed=7)
    engine.generate(reqs)
    assert (
        engine.generate([seeded])[0].response_ids == _engine(model, seed=7).generate([seeded])[0].response_ids
    )


# ---------------------------------------------------------------------------------------------
# streaming, pause / resume, weight updates
# ---------------------------------------------------------------------------------------------
def test_stream_yields_every_sample_once(model):
    engine = _engine(model, max_num_seqs=4)
    engine.start()
    prompts = _prompts(6, seed=7)
    uids = []
    try:
        engine.submit([_req("long", prompts[0], greedy=True, max_new_tokens=200)])
        engine.submit([_req(f"r{i}", p, n=2, max_new_tokens=3 + i) for i, p in enumerate(prompts[1:3])])
        for s in engine.stream(timeout=30):
            if not uids:  # submitting while streaming: the new samples are streamed too
                engine.submit([_req(f"late{i}", p, max_new_tokens=4) for i, p in enumerate(prompts[3:])])
            uids.append(s.uid)
    finally:
        engine.shutdown()
    expected = {"long/0", "r0/0", "r0/1", "r1/0", "r1/1", "late0/0", "late1/0", "late2/0"}
    assert sorted(uids) == sorted(expected)  # each exactly once
    assert uids[-1] == "long/0"  # the short ones were not held back by the long one
    assert engine.num_pending() == 0


def test_generate_drives_the_steps_on_the_calling_thread(model):
    # generate() blocks its caller anyway: it steps the engine itself, the background loop standing
    # by (no hand-off; one torch thread team at work: two made a small model's train step 2x slower)
    engine = _engine(model, max_num_seqs=8)
    engine.start()
    callers: list[threading.Thread] = []
    forward = model.forward

    def recording_forward(*args, **kwargs):
        callers.append(threading.current_thread())
        return forward(*args, **kwargs)

    model.forward = recording_forward
    prompts = _prompts(4, seed=11)
    try:
        out = engine.generate(
            [_req(f"g{i}", p, greedy=True, max_new_tokens=5) for i, p in enumerate(prompts)]
        )
        assert callers and set(callers) == {threading.current_thread()}
        for req_prompt, s in zip(prompts, out):
            assert s.response_ids == _reference_greedy(model, req_prompt, 5)
        # afterwards the background loop runs submitted work again
        callers.clear()
        engine.submit([_req("bg", prompts[0], greedy=True, max_new_tokens=3)])
        (s,) = list(engine.stream(timeout=30))
        assert callers and threading.current_thread() not in callers
        assert s.response_ids == _reference_greedy(model, prompts[0], 3)
    finally:
        del model.forward
        engine.shutdown()


def test_pause_resume_keeps_tokens(model):
    prompts = _prompts(3, seed=8)
    reqs = [_req(f"r{i}", p, greedy=True, max_new_tokens=60) for i, p in enumerate(prompts)]
    engine = _engine(model, max_num_seqs=2)
    engine.start()
    try:
        engine.submit(reqs)
        while engine.stats["tokens"] < 10:
            time.sleep(0.001)
        engine.pause()
        frozen = engine.stats["tokens"]
        time.sleep(0.1)
        assert engine.stats["tokens"] == frozen and engine.num_pending() == 3
        engine.resume()
        samples = sorted(engine.stream(timeout=30), key=lambda s: s.request_id)
    finally:
        engine.shutdown()
    assert frozen < 3 * 60
    for req, s in zip(reqs, samples):
        assert s.response_ids == _reference_greedy(model, req.prompt_ids, 60)
        assert s.finish_reason == "length"


@pytest.mark.parametrize("recompute", [True, False])
def test_weight_update_mid_generation(model, other_model, recompute):
    prompt = _prompts(1, seed=9)[0]
    engine = _engine(_tiny(0), recompute_kv_on_update=recompute)  # its own copy: weights change
    engine.submit([_req("a", prompt, greedy=True, max_new_tokens=12)])
    for _ in range(5):
        engine.step()
    engine.pause()
    engine.update_weights(other_model.state_dict().items(), version=1)
    engine.resume()
    (s,) = list(engine.stream())
    assert engine.version == 1
    assert s.versions == [0] * 5 + [1] * 7
    old = _reference_greedy(model, prompt, 12)
    assert s.response_ids[:5] == old[:5]
    assert s.response_ids != old  # later tokens come from the new weights
    if recompute:  # new weights over the whole context: the new model's continuation of what was kept
        assert s.response_ids[5:] == _reference_greedy(other_model, prompt + old[:5], 7)
        # and the log-probs of the new tokens are the new model's
        logits = _full_logits(other_model, prompt + s.response_ids)
        lp = logits[len(prompt) - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(s.response_ids)[:, None])
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs[5:]), lp[5:, 0], atol=1e-5, rtol=0)


def test_abort_returns_partial_samples(model):
    engine = _engine(model, max_num_seqs=1)
    engine.submit(
        [_req(f"r{i}", p, greedy=True, max_new_tokens=30) for i, p in enumerate(_prompts(2, seed=10))]
    )
    for _ in range(4):
        engine.step()
    assert engine.abort() == 2
    samples = sorted(engine.stream(), key=lambda s: s.request_id)
    assert [s.finish_reason for s in samples] == ["abort", "abort"]
    assert [len(s.response_ids) for s in samples] == [4, 0]  # r1 was still queued
    assert engine.num_pending() == 0


# ---------------------------------------------------------------------------------------------
# models without a cache, the backend shell
# ---------------------------------------------------------------------------------------------
class _NoCache(nn.Module):
    """A causal LM whose forward knows nothing about caches: returns logits only."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits


def test_model_without_cache_falls_back_to_recompute(model):
    prompts = _prompts(4, seed=11)
    reqs = [_req(f"r{i}", p, greedy=True, max_new_tokens=6 + 3 * i) for i, p in enumerate(prompts)]
    samples = _engine(_NoCache(model), max_num_seqs=2).generate(reqs)
    for req, s in zip(reqs, samples):
        assert s.response_ids == _reference_greedy(model, req.prompt_ids, req.sampling.max_new_tokens)


def test_backend_from_path(tmp_path, model):
    model.save_pretrained(tmp_path)
    spec = RolloutSpec(model_path=str(tmp_path), tokenizer_path=str(tmp_path), seed=1, max_response_length=8)
    backend = NativeRolloutBackend(NativeRolloutParams(max_num_seqs=2), spec)
    try:
        assert isinstance(backend, RolloutBackend)
        prompt = _prompts(1, seed=12)[0]
        data = {"ground_truth": "42"}
        req = GenerationRequest("q", prompt, SamplingParams(greedy=True, max_new_tokens=20), data=data)
        (s,) = backend.generate([req])
        assert s.response_ids == _reference_greedy(model, prompt, 8)  # capped by max_response_length
        assert s.data == data and s.finish_reason == "length"
        backend.pause()
        backend.update_weights(model.state_dict().items(), version=3)
        backend.resume()
        assert backend.version == 3 and backend.num_pending() == 0
    finally:
        backend.shutdown()


# ---------------------------------------------------------------------------------------------
# the KV cache: decode steps write in place (native.kv)
# ---------------------------------------------------------------------------------------------
def test_spare_columns_give_the_same_samples_as_concatenation(model):
    """Rows joining, retiring and buffers growing every 3 columns: the same tokens and log-probs,
    bit for bit, as transformers' DynamicLayer, which concatenates every step."""
    prompts = _prompts(9, seed=21)
    reqs = [
        _req(f"r{i}", p, temperature=0.9, top_p=0.95, max_new_tokens=5 + 4 * (i % 4), n=2, seed=i)
        for i, p in enumerate(prompts)
    ]
    ours = _engine(model, max_num_seqs=4, kv_spare_columns=3).generate(reqs)
    concatenated = _engine(model, max_num_seqs=4, kv_spare_columns=0).generate(reqs)
    assert [s.uid for s in ours] == [s.uid for s in concatenated]
    for a, b in zip(ours, concatenated):
        assert a.response_ids == b.response_ids
        assert a.rollout_log_probs == b.rollout_log_probs


def test_a_decode_step_writes_its_column_into_the_spare_buffer(model):
    """The cache's keys stay views of one buffer across decode steps (DynamicLayer's are a new
    tensor each step: the whole cache copied); the buffer grows once its spare columns are used."""
    from rlzoo.backends.native.kv import SPARE_COLUMNS, SpareLayer

    engine = _engine(model, max_num_seqs=2)
    engine.submit([_req("a", _prompts(1, seed=22)[0], greedy=True, max_new_tokens=SPARE_COLUMNS + 8, n=2)])
    engine.step()  # prefill + first decode
    layer = engine._rows.batch.cache.layers[0]
    assert isinstance(layer, SpareLayer)
    ptr, width = layer.keys.data_ptr(), layer.keys.shape[2]
    grown = []
    for step in range(1, SPARE_COLUMNS + 4):
        engine.step()
        layer = engine._rows.batch.cache.layers[0]
        assert layer.keys.shape[2] == width + step
        grown.append(layer.keys.data_ptr() != ptr)
        ptr = layer.keys.data_ptr()
    assert grown.count(True) == 1  # one copy in SPARE_COLUMNS + 3 steps, not one per step
