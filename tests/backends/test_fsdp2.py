"""The fsdp2 train backend on CPU / gloo, checked against the native backend in one process.

The distributed scenarios run once, in ``tests/backends/fsdp2_worker.py`` under
``torchrun --nproc_per_node=2`` (module fixture); each test compares one of its results with the
native backend (the reference: one process, no sharding) on the same tiny model and batches.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.backends.fsdp2 import FSDP2Params
from rlzoo.backends.fsdp2.sharding import balanced_shards, micro_batch_bounds, plan_shards
from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.protocols import TrainBackend
from rlzoo.kernel.settings import TrainSpec
from rlzoo.testing.backends import make_train_batch
from rlzoo.train_kit.logprobs import pack, unpack
from rlzoo.train_kit.params import HFTrainParams

from .conftest import torchrun

sys.path.insert(0, str(Path(__file__).parent))
from fsdp2_worker import PARAMS, SETTINGS, TokenMeanPG, TokenMeanValue, sample_batch, tiny_model

WORKER = Path(__file__).with_name("fsdp2_worker.py")
SPEC = TrainSpec(model_path="", need_reference=True, need_critic=True, total_steps=10, **SETTINGS)
ATOL = 1e-5


# ---------------------------------------------------------------------------------------------
# pure helpers (no process group)
# ---------------------------------------------------------------------------------------------
def test_balanced_shards_by_tokens() -> None:
    # tokens 9, 1, 5, 4, 3 over 2 ranks, longest first to the lighter rank:
    # 9 -> r0 (9); 5 -> r1 (5); 4 -> r1 (9); 3 -> r0 (12) ... tie 9/9 at "4": r1 had 5 < 9.
    # then 3 -> lighter of (9, 9): fewer samples -> r0 (1 sample) -> r0 = 12; 1 -> r1 = 10.
    assert balanced_shards([9, 1, 5, 4, 3], 2) == [[0, 4], [1, 2, 3]]
    assert balanced_shards([2, 2], 3) == [[0], [1], []]  # an empty shard when B < world


def test_micro_batch_bounds() -> None:
    assert micro_batch_bounds([3, 3, 3, 3, 3], rows=2, max_tokens=None) == [(0, 2), (2, 4), (4, 5)]
    # max 6 tokens: [3, 3] | [7] (too long, alone) | [2, 4] | [] -> 3 micro-batches
    assert micro_batch_bounds([3, 3, 7, 2, 4], rows=99, max_tokens=6) == [(0, 2), (2, 3), (3, 5)]
    assert micro_batch_bounds([], rows=2, max_tokens=None) == []


def test_plan_pads_short_ranks_with_dummy_passes() -> None:
    b = sample_batch(1, B=5)
    plan = plan_shards(b, 2, rows=2, max_tokens=None)
    assert sorted(i for s in plan.shards for i in s) == list(range(5))
    assert plan.num_micro_batches == max(len(x) for x in plan.bounds) == 2
    assert sorted(plan.order().tolist()) == list(range(5))


def test_pack_positions_and_targets() -> None:
    # sample 0: prompt [5, 6], response [7, 8]; sample 1: prompt [9], response [10] (+1 pad)
    b = make_train_batch([[5, 6], [9]], [[7, 8], [10]])
    pk = pack(b)
    assert pk.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    # response tokens sit at packed 2, 3, 5; they are predicted from 1, 2, 4
    assert pk.predict_at.tolist() == [1, 2, 4]
    assert pk.targets.tolist() == [7, 8, 10]
    assert unpack(torch.tensor([1.0, 2.0, 3.0]), pk.response_valid).tolist() == [[1.0, 2.0], [3.0, 0.0]]


def test_params_validate() -> None:
    with pytest.raises(ValueError, match="fsdp_size"):
        FSDP2Params(fsdp_size=0)
    with pytest.raises(ValueError, match="invalid fsdp2 train params: dtype"):
        FSDP2Params(dtype="float16")
    assert isinstance(FSDP2Params(), HFTrainParams)


def test_registered_as_train_backend() -> None:
    from rlzoo.backends import fsdp2

    seen = {}

    class Reg:
        def register(self, name, target, **kw):  # type: ignore[no-untyped-def]
            seen[name] = (target, kw)

    fsdp2.rlzoo_register_train_backends(Reg())
    target, kw = seen["fsdp2"]
    assert target == "rlzoo.backends.fsdp2.train:FSDP2TrainBackend"
    assert kw["params"] is FSDP2Params
    assert kw["capabilities"] == {
        "distributed": True,
        "devices": ["cpu", "cuda"],
        "supports_critic": True,
        "supplies_sum_pi_squared": True,
        "supports_lora": True,
        "supports_teacher": True,
    }
    assert FSDP2Params.__doc__.splitlines()[0].strip()


# ---------------------------------------------------------------------------------------------
# one process: the backend starts its own gloo group
# ---------------------------------------------------------------------------------------------
@pytest.mark.distributed
def test_single_process_group_matches_native() -> None:
    import torch.distributed as dist

    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    b = sample_batch(3)
    params = FSDP2Params(**PARAMS)
    be = FSDP2TrainBackend(params, TrainSpec(model_path="", **SETTINGS), model=tiny_model(0))
    try:
        assert isinstance(be, TrainBackend)
        native = NativeTrainBackend.from_module(
            tiny_model(0), NativeTrainParams(**PARAMS), TrainSpec(model_path="", **SETTINGS)
        )
        torch.testing.assert_close(
            be.compute_log_probs(b)[0], native.compute_log_probs(b)[0], atol=ATOL, rtol=0
        )
        m = be.update_policy(b, TokenMeanPG(b))
        mn = native.update_policy(b, TokenMeanPG(b))
        assert m["actor/loss"] == pytest.approx(mn["actor/loss"], abs=ATOL)
        assert be.version == native.version == 1
        theirs = dict(native.export_weights())
        for name, t in be.export_weights():
            torch.testing.assert_close(t, theirs[name], atol=ATOL, rtol=0)
    finally:
        be.shutdown()
    assert not dist.is_initialized()  # the group it created is gone


@pytest.mark.distributed
def test_teacher_log_probs_equal_native(tmp_path: Path) -> None:
    """The teacher (algorithm.teacher) sharded like the reference: its log-probs equal the native
    backend's, and differ from the actor's."""
    import dataclasses

    import torch.distributed as dist

    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend
    from rlzoo.kernel.settings import TeacherModel

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    tiny_model(1).save_pretrained(tmp_path / "teacher")
    spec = dataclasses.replace(
        TrainSpec(model_path="", **SETTINGS),
        teacher=TeacherModel(path=str(tmp_path / "teacher"), dtype=None, trust_remote_code=False),
    )
    b = sample_batch(3)
    be = FSDP2TrainBackend(FSDP2Params(**PARAMS), spec, model=tiny_model(0))
    try:
        native = NativeTrainBackend.from_module(tiny_model(0), NativeTrainParams(**PARAMS), spec)
        got = be.compute_log_probs(b, model="teacher")[0]
        torch.testing.assert_close(got, native.compute_log_probs(b, model="teacher")[0], atol=ATOL, rtol=0)
        assert not torch.allclose(got, be.compute_log_probs(b)[0])
    finally:
        be.shutdown()


# ---------------------------------------------------------------------------------------------
# two processes (torchrun): invariance with the native backend
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dist_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    out = tmp_path_factory.mktemp("fsdp2")
    torchrun(str(WORKER), str(out), timeout=300)
    tensors = load_file(str(out / "results.safetensors"))
    numbers = json.loads((out / "results.json").read_text())
    return tensors, numbers, out


@pytest.fixture(scope="module")
def native_run() -> dict:
    """The same scenario on the native backend (one process): the reference."""
    b1, b2 = sample_batch(1), sample_batch(2)
    be = NativeTrainBackend.from_module(tiny_model(0), NativeTrainParams(**PARAMS), SPEC)
    r: dict = {}
    r["lp"], r["ent"] = be.compute_log_probs(b1, with_entropy=True)
    r["m1"] = be.update_policy(b1, TokenMeanPG(b1))
    r["w1"] = {n: t.clone() for n, t in be.export_weights()}
    r["ref_lp"] = be.compute_log_probs(b1, model="ref")[0]
    r["values0"] = be.compute_values(b1)
    r["cm1"] = be.update_critic(b1, TokenMeanValue(b1))
    r["values1"] = be.compute_values(b1)
    r["m2"] = be.update_policy(b2, TokenMeanPG(b2))
    r["w2"] = {n: t.clone() for n, t in be.export_weights()}
    be.update_critic(b2, TokenMeanValue(b2))
    r["values2"] = be.compute_values(b2)
    return r


def _weights(tensors: dict, prefix: str) -> dict:
    return {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + "/")}


def _assert_weights_close(ours: dict, theirs: dict, atol: float = ATOL) -> None:
    assert set(ours) == set(theirs)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], atol=atol, rtol=0, msg=name)


@pytest.mark.distributed
@pytest.mark.parametrize("tag", ["packed", "padded"])
def test_log_probs_equal_native(dist_results, native_run, tag) -> None:
    tensors, _, _ = dist_results
    torch.testing.assert_close(tensors[f"{tag}/lp"], native_run["lp"], atol=ATOL, rtol=0)
    torch.testing.assert_close(tensors[f"{tag}/ent"], native_run["ent"], atol=ATOL, rtol=0)
    torch.testing.assert_close(
        tensors[f"{tag}/ref_lp"], native_run["lp"], atol=ATOL, rtol=0
    )  # initial weights


@pytest.mark.distributed
def test_padding_free_equals_padded(dist_results) -> None:
    tensors, _, _ = dist_results
    torch.testing.assert_close(tensors["packed/lp"], tensors["padded/lp"], atol=ATOL, rtol=0)
    torch.testing.assert_close(tensors["packed/values1"], tensors["padded/values1"], atol=ATOL, rtol=0)


@pytest.mark.distributed
@pytest.mark.parametrize("tag", ["packed", "padded"])
def test_update_invariant_to_sharding(dist_results, native_run, tag) -> None:
    """2 ranks x 2 micro-batches == 1 process x 4 micro-batches: same loss, norm, weights.

    Fails by a factor of 2 in the gradient if FSDP2 averaged over ranks instead of summing.
    """
    tensors, numbers, _ = dist_results
    m, mn = numbers[f"{tag}/metrics"], native_run["m1"]
    assert m["actor/loss"] == pytest.approx(mn["actor/loss"], abs=ATOL)
    assert m["actor/grad_norm"] == pytest.approx(mn["actor/grad_norm"], rel=1e-5)
    _assert_weights_close(_weights(tensors, f"{tag}/w1"), native_run["w1"])


@pytest.mark.distributed
def test_critic_values_and_update(dist_results, native_run) -> None:
    tensors, numbers, _ = dist_results
    B, T = sample_batch(1)["responses"].shape
    assert tensors["packed/values0"].shape == (B, T)
    assert torch.count_nonzero(tensors["packed/values0"]) == 0  # zero-initialised value head
    assert numbers["packed/critic_metrics"]["critic/loss"] == pytest.approx(
        native_run["cm1"]["critic/loss"], abs=ATOL
    )
    torch.testing.assert_close(tensors["packed/values1"], native_run["values1"], atol=ATOL, rtol=0)
    assert torch.count_nonzero(tensors["packed/values1"]) > 0


@pytest.mark.distributed
def test_checkpoint_resume_equals_uninterrupted(dist_results, native_run) -> None:
    tensors, numbers, out = dist_results
    assert numbers["resume/extra"] == {"step": 1, "note": "x"}
    assert numbers["resume/version"] == 1
    assert numbers["resume/metrics2"]["actor/loss"] == numbers["packed/metrics2"]["actor/loss"]
    _assert_weights_close(_weights(tensors, "resumed/w2"), _weights(tensors, "uninterrupted/w2"), atol=0.0)
    torch.testing.assert_close(tensors["resumed/values2"], tensors["uninterrupted/values2"], atol=0.0, rtol=0)
    _assert_weights_close(_weights(tensors, "uninterrupted/w2"), native_run["w2"])
    ck = out / "ckpt"
    assert (ck / "COMPLETE").is_file() and (ck / "actor" / ".metadata").is_file()
    assert json.loads((ck / "meta.json").read_text())["world_size"] == 2


@pytest.mark.distributed
def test_export_hf_loads_with_transformers(dist_results) -> None:
    from transformers import AutoModelForCausalLM

    tensors, _, out = dist_results
    model = AutoModelForCausalLM.from_pretrained(str(out / "hf"), dtype=torch.float32)
    lp, _ = NativeTrainBackend.from_module(model, NativeTrainParams(device="cpu")).compute_log_probs(
        sample_batch(2)
    )
    torch.testing.assert_close(lp, tensors["packed/lp2"], atol=ATOL, rtol=0)


@pytest.mark.distributed
def test_non_finite_loss_on_one_rank_skips_everywhere(dist_results) -> None:
    _, numbers, _ = dist_results
    assert numbers["nan"] == {"skipped": 1.0, "version_same": True, "weights_same": True}
