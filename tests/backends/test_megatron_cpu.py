"""The megatron train backend on CPU against the real megatron-core (gloo group, ``device: cpu``).

One process (TP=1) runs the whole train contract (:class:`~rlzoo.testing.backends.TrainBackendContract`)
in this process; TP=2 and PP=2 run it in two gloo processes (``tests/backends/megatron_worker.py``
under ``torchrun --nproc_per_node=2``). Skipped with a reason when megatron-core is not installed.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from rlzoo.backends.megatron import MegatronParams
from rlzoo.backends.megatron.convert import ModelDims, transformer_config_kwargs
from rlzoo.testing.backends import TrainBackendContract, save_tiny_qwen2

from .conftest import torchrun
from .megatron_contract_dist import critic_checkpoint_round_trip

HAVE_MCORE = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)


pytestmark = pytest.mark.usefixtures("one_thread")


class TestMegatronTrainCPU(TrainBackendContract):
    name = "megatron"
    requires = ("megatron.core", "psutil")
    params_overrides = {"device": "cpu", "dtype": "float32", "use_distributed_optimizer": False}
    lp_atol = 1e-4
    update_atol = 1e-5


class TestMegatronTrainCPUDistOpt(TestMegatronTrainCPU):
    """TP=1 with the distributed optimizer (its checkpoint layout, its main-param views)."""

    params_overrides = {**TestMegatronTrainCPU.params_overrides, "use_distributed_optimizer": True}


# -- TP=2, PP=2, DP=2: two gloo processes under torchrun ----------------------------------------
DIST_MODULE = Path(__file__).with_name("megatron_contract_dist.py")


@pytest.mark.distributed
@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2", "ep2"])
def test_contract_in_two_processes(layout: str, tmp_path: Path) -> None:
    node = f"{DIST_MODULE}::TestMegatronTrainDist"  # the contract, not the critic's test beside it
    pytest_args = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", node)
    out = torchrun(
        *pytest_args,
        timeout=600,
        what=f"{layout}: torchrun",
        RLZOO_MEGATRON_LAYOUT=layout,
        RLZOO_CONTRACT_DIR=str(tmp_path),
    )
    n = str(sum(1 for name in dir(TrainBackendContract) if name.startswith("test_")))
    assert re.findall(r"(\d+) passed", out) == [n, n], out[-3000:]  # both ranks, every contract test


# -- defects found against the real megatron-core (issue 17) -----------------------------------
@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_transformer_config_accepts_variable_seq_lengths() -> None:
    """megatron-core refuses variable_seq_lengths with its default allgather MoE dispatcher."""
    from megatron.core.transformer import TransformerConfig

    dims = ModelDims(
        num_layers=2,
        hidden_size=32,
        ffn_hidden_size=48,
        num_attention_heads=4,
        num_query_groups=2,
        head_dim=8,
        vocab_size=64,
    )
    cfg = TransformerConfig(**transformer_config_kwargs(dims, use_cpu_initialization=True))
    assert cfg.variable_seq_lengths and cfg.moe_token_dispatcher_type == "alltoall"


def test_refused_combinations_say_why() -> None:
    with pytest.raises(ValueError, match="sequence_parallel needs layer_spec 'te'"):
        MegatronParams(tensor_model_parallel_size=2, sequence_parallel=True)
    with pytest.raises(ValueError, match="optimizer_offload needs use_distributed_optimizer"):
        MegatronParams(optimizer_offload=True, use_distributed_optimizer=False)
    with pytest.raises(ValueError, match="device must be"):
        MegatronParams(device="tpu")


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TE installed")
def test_transformer_engine_features_refused_without_it() -> None:
    for kw in ({"optimizer_offload": True}, {"layer_spec": "te"}):
        with pytest.raises(ValueError, match="need\\(s\\) NVIDIA Transformer Engine, which is not installed"):
            MegatronParams(**kw)


def test_geo3k_recipe_params_are_valid_here() -> None:
    """The recipe's megatron params pass validation without Transformer Engine (every key is one)."""
    import yaml

    recipe = Path(__file__).parents[2] / "src" / "rlzoo" / "recipes" / "grpo_geo3k_vl.yaml"
    backend = dict(yaml.safe_load(recipe.read_text())["trainer"]["backend"])
    backend.pop("name")
    MegatronParams(**backend)


def test_psutil_is_declared_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """megatron-core's checkpoint writer hangs without psutil: declared in the extra, checked first."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["megatron"]
    assert any(d.startswith("psutil") for d in extra), extra
    from rlzoo.backends.megatron import train

    monkeypatch.setitem(sys.modules, "psutil", None)  # what a missing package looks like to import
    with pytest.raises(ImportError, match="needs psutil"):
        train._require_psutil()


CPU = {"device": "cpu", "dtype": "float32", "use_distributed_optimizer": False}


def _backend(tmp: Path, **kw):  # type: ignore[no-untyped-def]
    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import OptimSettings, TrainSpec

    path = tmp / "model"
    if not path.exists():
        save_tiny_qwen2(path)
    spec = TrainSpec(
        model_path=str(path),
        total_steps=10,
        temperature=0.9,
        need_critic=kw.pop("critic", False),
        optim=kw.pop("optim", OptimSettings(lr=1e-2, grad_clip=0.0)),
    )
    return MegatronTrainBackend(MegatronParams(**{**CPU, **kw}), spec)


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_param_offload_without_distributed_optimizer(tmp_path: Path) -> None:
    """Without the distributed optimizer DDP has no contiguous param buffer: params go one by one."""
    import torch

    from rlzoo.testing.backends import TokenMeanObjective, _random_batch

    batch = _random_batch(5)
    out = []
    for offload in (False, True):
        b = _backend(tmp_path, param_offload=offload, grad_offload=offload)
        try:
            if offload:  # between phases the weights' storage is freed
                assert all(p.untyped_storage().size() == 0 for p in b.actor.parameters())
            b.update_policy(batch, TokenMeanObjective(batch))
            out.append(b.compute_log_probs(batch)[0])
        finally:
            b.shutdown()
    torch.testing.assert_close(out[1], out[0], atol=1e-6, rtol=0)


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_actor_and_critic_have_their_own_config(tmp_path: Path) -> None:
    """DDP's no_sync / finalize hooks live on the model's config: one shared config would make the
    actor's micro-batch loop call the critic's hooks."""
    b = _backend(tmp_path, critic=True)
    try:
        assert b.actor.config is not b.critic.config
        assert b.actor.config.no_sync_func == b.actor_ddp.no_sync
        assert b.critic.config.no_sync_func == b.critic_ddp.no_sync
    finally:
        b.shutdown()


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_reads_the_shared_trainer_settings(tmp_path: Path) -> None:
    """lr / schedule come from TrainSpec.optim; token-budget micro-batches are refused up front."""
    import dataclasses

    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TrainSpec

    save_tiny_qwen2(tmp_path / "m")
    optim = OptimSettings(lr=2e-3, lr_scheduler="linear", warmup_steps=2, min_lr_ratio=0.5, critic_lr=3e-3)
    spec = TrainSpec(model_path=str(tmp_path / "m"), total_steps=10, optim=optim)
    b = MegatronTrainBackend(MegatronParams(**CPU), spec)
    try:
        # linear warmup over 2 steps, then linear decay from 2e-3 to 1e-3 at step 10 (verl's / HF's rule)
        lr = b.schedule.lr
        assert lr(0) == pytest.approx(1e-3) and lr(2) == pytest.approx(2e-3)
        assert lr(10) == pytest.approx(1e-3) and lr(2, critic=True) == pytest.approx(3e-3)
    finally:
        b.shutdown()
    bad = dataclasses.replace(spec, micro_batch=MicroBatchSettings(max_tokens=512))
    with pytest.raises(ValueError, match="max_tokens=512 is not supported"):
        MegatronTrainBackend(MegatronParams(**CPU), bad)


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_bf16_with_grad_clipping_and_distributed_optimizer(tmp_path: Path) -> None:
    """bf16 weights with fp32 main params, the distributed optimizer and grad clipping (megatron-core
    checks for CUDA tensor type names on all three): the update clips to the bound and moves the
    weights; save → load of the distributed optimizer's state."""
    import torch

    from rlzoo.kernel.settings import OptimSettings
    from rlzoo.testing.backends import TokenMeanObjective, _random_batch

    optim = OptimSettings(lr=1e-2, grad_clip=1e-3)
    b = _backend(tmp_path, dtype="bfloat16", use_distributed_optimizer=True, optim=optim)
    try:
        batch = _random_batch(6)
        before = b.compute_log_probs(batch)[0]
        m = b.update_policy(batch, TokenMeanObjective(batch))
        after = b.compute_log_probs(batch)[0]
        assert m["actor/grad_norm"] > 1e-3 and not m["actor/skipped_steps"] and b.version == 1
        assert not torch.equal(before, after)
        b.save_checkpoint(tmp_path / "ck", {"k": 1})
        assert b.load_checkpoint(tmp_path / "ck") == {"k": 1}
    finally:
        b.shutdown()


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
def test_shutdown_tears_down_the_group_it_started(tmp_path: Path) -> None:
    """A backend that started the process group (and megatron's model-parallel state) tears both
    down when the last backend using them shuts down, so the process is left as it was found
    (before: the group leaked into every later test of the process)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    if dist.is_initialized():
        pytest.skip("a process group was started outside this test")
    a = _backend(tmp_path)
    b = _backend(tmp_path)  # shares the group a started
    a.shutdown()
    assert dist.is_initialized() and mpu.model_parallel_is_initialized()  # b still uses them
    b.shutdown()
    assert not dist.is_initialized()
    assert not mpu.model_parallel_is_initialized()
    b.shutdown()  # idempotent


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
@pytest.mark.parametrize("distributed_optimizer", [False, True], ids=["adam", "distopt"])
def test_checkpoint_with_critic_round_trip(tmp_path: Path, distributed_optimizer: bool) -> None:
    """PPO's critic (the value head in place of ``output_layer``) is saved and loaded with the actor
    (before: ``KeyError: 'output_layer.weight'`` in megatron-core's ``sharded_state_dict`` of the
    critic); see :func:`.megatron_contract_dist.critic_checkpoint_round_trip`."""
    from rlzoo.kernel.settings import OptimSettings

    optim = OptimSettings(lr=1e-2, critic_lr=1e-2, grad_clip=0.0)
    kw = {"critic": True, "optim": optim, "use_distributed_optimizer": distributed_optimizer}
    critic_checkpoint_round_trip(lambda: _backend(tmp_path, **kw), tmp_path / "ck")


@pytest.mark.distributed
@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2"])
def test_checkpoint_with_critic_in_two_processes(layout: str, tmp_path: Path) -> None:
    """The critic's checkpoint round trip with the value head replicated over TP (tp2), on the last
    PP stage only (pp2), and in the distributed optimizer's DP-sharded state (dp2)."""
    node = f"{DIST_MODULE}::test_critic_checkpoint_round_trip"
    out = torchrun(
        *("-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", node),
        timeout=600,
        what=f"{layout}: torchrun",
        RLZOO_MEGATRON_LAYOUT=layout,
        RLZOO_CONTRACT_DIR=str(tmp_path),
    )
    assert re.findall(r"(\d+) passed", out) == ["1", "1"], out[-3000:]
