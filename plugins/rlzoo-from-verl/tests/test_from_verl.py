"""`rlzoo from-verl`: verl launch scripts (fixtures in verl's syntax) -> recipes `validate` accepts,
with the same algorithm, batch, async and placement knobs; every verl key accounted for."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from rlzoo_from_verl import (
    TABLE,
    VERL_DEFAULTS,
    convert,
    from_verl,
    parse_command,
    parse_overrides,
    parse_value,
    render,
    table_markdown,
)

from rlzoo.cli import main
from rlzoo.kernel.errors import RlzooError
from rlzoo.recipe.config import load_config

SCRIPTS = Path(__file__).parent / "verl_scripts"
ENV = {"HOME": "/home/u", "DATA_HOME": "/data"}


@pytest.fixture(autouse=True)
def _fixed_env(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("MODEL_PATH", "TRAIN_FILE", "TEST_FILE", "NNODES", "NGPUS_PER_NODE", "HF_MODEL_PATH"):
        monkeypatch.delenv(k, raising=False)


def ov(text: str):
    return parse_overrides(text.split())


@pytest.fixture(autouse=True)
def _wandb_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripts that log to W&B: validating them must not depend on this machine's W&B login
    (online W&B without a key is refused by validate)."""
    monkeypatch.setenv("WANDB_MODE", "offline")


def convert_script(name: str, tmp_path: Path):
    out = tmp_path / f"{name}.yaml"
    conv, text = from_verl(str(SCRIPTS / f"{name}.sh"), out)
    cfg = load_config(str(out))  # what `rlzoo validate FILE` does
    return conv, cfg, yaml.safe_load(text), (SCRIPTS / f"{name}.sh").read_text()


def assert_every_key_accounted_for(conv, script: str, fixed: dict[str, str] | None = None) -> None:
    cmd = parse_command(script, fixed=fixed)  # the environment the conversion saw (ENV + the test's own)
    report = conv.report()
    missing = [k for k, _ in cmd.overrides if k not in report]
    assert not missing, f"verl keys not in the report: {missing}"


def test_seed_dapo_fully_async_fsdp2(tmp_path):
    conv, cfg, _raw, script = convert_script("dapo_7b_math_fsdp2_4_4", tmp_path)
    # algorithm
    assert cfg.algorithm.advantage.name == "grpo"
    pl = cfg.algorithm.policy_loss
    assert pl.name == "ppo_clip"
    assert (pl.params.clip_ratio_low, pl.params.clip_ratio_high, pl.params.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert cfg.algorithm.loss_agg.name == "token-mean"
    assert not cfg.algorithm.use_kl_loss and not cfg.algorithm.use_kl_in_reward
    assert cfg.reward.manager.name == "dapo"
    rm = cfg.reward.manager.params
    assert (rm.enable, rm.overlong_buffer_len, rm.penalty_factor, rm.max_response_length) == (
        True,
        4096,
        1.0,
        8192,
    )
    # old log-probs := rollout log-probs (use_rollout_log_probs=True)
    assert cfg.algorithm.rollout_correction.name == "none"
    assert cfg.algorithm.rollout_correction.params.mode == "bypass"
    # batch
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (2048, 8192)
    assert cfg.data.truncation == "left"
    assert cfg.rollout.n == 16 and cfg.trainer.ppo_mini_batch_size == 32
    assert cfg.data.train_batch_size == 4 * 32  # require_batches x mini-batch (verl's is 0 here)
    assert cfg.trainer.micro_batch.max_tokens == (2048 + 8192) * 2
    assert cfg.trainer.optim.lr == 1e-6 and cfg.trainer.optim.warmup_steps == 10
    assert cfg.trainer.optim.weight_decay == 0.1 and cfg.trainer.optim.grad_clip == 1.0
    assert cfg.rollout.val.top_p == 0.7 and cfg.rollout.val.temperature == 1.0  # do_sample=True
    # async
    assert cfg.runner.name == "fully_async"
    rp = cfg.runner.params
    assert (rp.staleness_threshold, rp.trigger_parameter_sync_step, rp.require_batches) == (0.1, 4, 4)
    assert rp.partial_rollout is True and rp.total_rollout_steps == 512 * 100
    assert cfg.trainer.total_steps is None and cfg.trainer.test_freq == 10
    # placement: 4 GPUs train (FSDP2, fsdp_size 2, ref offloaded), 4 generate (vLLM TP 1)
    assert cfg.placement.name == "ray" and cfg.placement.colocate is False
    assert (cfg.placement.trainer.nnodes, cfg.placement.trainer.n_gpus_per_node) == (1, 4)
    assert (cfg.placement.rollout.nnodes, cfg.placement.rollout.n_gpus_per_node) == (1, 4)
    tb = cfg.trainer.backend
    assert tb.name == "fsdp2" and tb.params.fsdp_size == 2 and tb.params.ref_offload is True
    assert cfg.rollout.backend.name == "vllm" and cfg.rollout.backend.params.tensor_parallel_size == 1
    assert cfg.rollout.backend.params.gpu_memory_utilization == 0.8
    assert cfg.model.path == "/data/models/Qwen2.5-Math-7B"  # ${DATA_HOME} expanded
    assert cfg.data.train_files == ["/data/data/dapo-math-17k.parquet"]
    # the one knob rlzoo has no key for is a written manual step, not a silent drop
    assert [k for k, _, _ in conv.manual] == [
        "actor_rollout_ref.model.override_config.max_position_embeddings"
    ]
    assert "MANUAL STEP" in (tmp_path / "dapo_7b_math_fsdp2_4_4.yaml").read_text()
    assert_every_key_accounted_for(conv, script)


def test_seed_geo3k_fully_async_megatron(tmp_path):
    conv, cfg, _raw, script = convert_script("geo3k_qwen25vl_7b_megatron_4_4", tmp_path)
    assert cfg.algorithm.advantage.name == "grpo"
    assert cfg.algorithm.use_kl_loss and cfg.algorithm.kl_loss_coef == 0.01
    assert cfg.algorithm.kl_loss.name == "k3"  # low_var_kl
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (1024, 2048)
    assert cfg.data.truncation == "filter"  # filter_overlong_prompts=True
    assert cfg.rollout.n == 4 and cfg.trainer.ppo_mini_batch_size == 128
    assert cfg.data.train_batch_size == 2 * 128
    # rlzoo's megatron splits by sample count: verl's token budget is reported, the per-GPU size kept
    assert cfg.trainer.micro_batch.max_tokens is None and cfg.trainer.micro_batch.size == 1
    assert any("packs micro-batches by sample count" in why for _, _, why in conv.skipped)
    assert cfg.runner.name == "fully_async"
    rp = cfg.runner.params
    assert (rp.staleness_threshold, rp.trigger_parameter_sync_step, rp.require_batches) == (0.1, 4, 2)
    assert rp.partial_rollout is True and rp.total_rollout_steps == 51200
    assert cfg.placement.name == "ray" and cfg.placement.colocate is False
    assert cfg.placement.trainer.n_gpus_per_node == 4 and cfg.placement.rollout.n_gpus_per_node == 4
    tb = cfg.trainer.backend  # --config-name=fully_async_ppo_megatron_trainer.yaml -> megatron
    assert tb.name == "megatron"
    assert (tb.params.tensor_model_parallel_size, tb.params.pipeline_model_parallel_size) == (2, 1)
    assert tb.params.param_offload and tb.params.grad_offload and tb.params.ref_offload
    rb = cfg.rollout.backend.params
    assert (rb.max_model_len, rb.max_num_batched_tokens, rb.tensor_parallel_size) == (32768, 32768, 1)
    assert rb.engine_kwargs == {"disable_mm_preprocessor_cache": "True"}
    assert cfg.rollout.backend.name == "vllm"  # ENGINE=${1:-vllm}
    assert [getattr(s, "name", s) for s in cfg.run.loggers] == ["console", "wandb", "jsonl"]
    assert not conv.manual
    skipped = {k for k, _, _ in conv.skipped}
    assert "actor_rollout_ref.actor.megatron.optimizer_offload" in skipped  # needs Transformer Engine
    assert_every_key_accounted_for(conv, script)


def test_verl_example_gsm8k_grpo(tmp_path):
    conv, cfg, _raw, script = convert_script("run_qwen2-7b_gsm8k_grpo", tmp_path)
    assert cfg.runner.name == "sync"
    assert cfg.algorithm.advantage.name == "grpo" and cfg.algorithm.use_kl_loss
    assert cfg.algorithm.kl_loss_coef == 0.001
    assert (cfg.data.train_batch_size, cfg.trainer.ppo_mini_batch_size, cfg.rollout.n) == (1024, 256, 5)
    assert cfg.trainer.micro_batch.size == 40 and cfg.trainer.micro_batch.log_prob_size == 40
    assert cfg.placement.name == "ray" and cfg.placement.colocate is True
    assert cfg.placement.trainer.n_gpus_per_node == 8
    assert cfg.trainer.backend.name == "fsdp2" and cfg.trainer.backend.params.gradient_checkpointing
    assert cfg.rollout.backend.params.tensor_parallel_size == 2
    assert cfg.trainer.total_epochs == 15 and cfg.trainer.test_freq == 5
    assert cfg.rollout.val.temperature == 0.0  # verl validates greedily by default
    assert_every_key_accounted_for(conv, script)


def test_verl_example_gsm8k_ppo_with_critic(tmp_path):
    conv, cfg, _raw, script = convert_script("run_deepseek7b_llm_gsm8k_ppo", tmp_path)
    assert cfg.algorithm.advantage.name == "gae"
    assert cfg.model.critic_path == "deepseek-ai/deepseek-llm-7b-chat"
    assert cfg.trainer.optim.critic_lr == 1e-5 and cfg.trainer.optim.lr == 1e-6
    assert cfg.rollout.n == 1  # verl's default, not rlzoo's 4
    assert cfg.runner.name == "sync" and cfg.placement.colocate is True
    assert_every_key_accounted_for(conv, script)


def test_overrides_alone_and_verl_defaults():
    conv = convert(ov("algorithm.adv_estimator=grpo data.train_batch_size=64"))
    assert conv.recipe["runner"] == {"name": "sync"}
    assert conv.get("data.train_batch_size") == 64
    assert conv.get("rollout.n") == 1 and conv.get("data.max_response_length") == 512  # verl defaults
    assert conv.get("trainer.total_epochs") == 30
    tagged = [m for m in conv.mapped if m[0] == "data.max_response_length"]
    assert tagged and "verl default" in tagged[0][4]
    conv = convert(ov("async_training.require_batches=2 actor_rollout_ref.actor.ppo_mini_batch_size=8"))
    assert conv.recipe["runner"]["name"] == "fully_async" and conv.get("data.train_batch_size") == 16


def test_unmappable_keys_fail_with_the_full_list():
    with pytest.raises(RlzooError) as e:
        from_verl(["algorithm.adv_estimator=grpo", "foo.bar=1", "actor_rollout_ref.rollout.name=lmdeploy"])
    msg = str(e.value)
    assert "2 verl key(s) cannot be mapped" in msg and "foo.bar" in msg and "lmdeploy" in msg
    with pytest.raises(RlzooError, match="megatron backend has no Ulysses"):
        from_verl(
            [
                "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            ]
        )
    with pytest.raises(RlzooError, match="found no verl launch"):
        parse_command("echo hello", ENV)


def test_rollout_correction_and_filter_groups_mapping():
    conv = convert(
        ov(
            "algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0 "
            "algorithm.rollout_correction.rollout_rs=token_k1,seq_mean_k3 "
            "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0,0.01 "
            "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4 "
            "algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc "
            "algorithm.filter_groups.max_num_gen_batches=10",
        )
    )
    assert conv.get("algorithm.rollout_correction") == {
        "name": "rejection",
        "criteria": "token_k1,seq_mean_k3",
        "thresholds": "0.5_2.0,0.01",
        "is_level": "token",
        "is_threshold": 2.0,
        "token_veto_threshold": 1e-4,
        "mode": "decoupled",
    }
    assert conv.get("algorithm.sample_filter") == {
        "name": "dynamic_sampling",
        "metric": "acc",
        "max_num_gen_batches": 10,
    }
    icepop = convert(
        ov(
            "algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=0.5_5.0"
        )
    )
    assert icepop.get("algorithm.rollout_correction")["name"] == "icepop"


def test_policy_loss_params_only_where_the_loss_declares_them():
    conv = convert(
        ov(
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo actor_rollout_ref.actor.clip_ratio_c=10.0 "
            "actor_rollout_ref.actor.clip_ratio_low=3e-4 actor_rollout_ref.actor.clip_ratio_high=4e-4"
        )
    )
    assert conv.get("algorithm.policy_loss") == {
        "name": "gspo",
        "clip_ratio_low": 3e-4,
        "clip_ratio_high": 4e-4,
    }
    assert any(k.endswith("clip_ratio_c") and "has no clip_ratio_c" in why for k, _, why in conv.skipped)
    dro = convert(
        ov(
            "actor_rollout_ref.actor.policy_loss.loss_mode=dro actor_rollout_ref.actor.policy_loss.dro_beta=0.2"
        )
    )
    assert dro.get("algorithm.policy_loss.beta") == 0.2


def test_cli_writes_a_recipe_validate_accepts(tmp_path, capsys):
    out = tmp_path / "grpo.yaml"
    assert main(["from-verl", str(SCRIPTS / "run_qwen2-7b_gsm8k_grpo.sh"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "actor_rollout_ref.rollout.n = 5  ->  rollout.n = 5" in printed
    assert main(["validate", str(out)]) == 0


def test_docs_show_the_mapping_table():
    doc = (Path(__file__).parents[3] / "docs" / "from-verl.md").read_text()
    assert table_markdown() in doc, "docs/from-verl.md is stale: paste rlzoo_from_verl.table_markdown()"
    assert set(VERL_DEFAULTS) <= set(TABLE)


# ---------------------------------------------------------------------------------------------
# the fixture set: verl-style scripts written for these tests (docs/from-verl.md lists them)
# ---------------------------------------------------------------------------------------------
def test_rloo_arrays_and_inert_keys(tmp_path):
    conv, cfg, _raw, script = convert_script("rloo_gsm8k_arrays", tmp_path)
    assert cfg.algorithm.advantage.name == "rloo" and cfg.rollout.n == 5
    assert cfg.model.path == "/home/u/models/Qwen2-7B-Instruct" and cfg.model.dtype == "bfloat16"
    assert cfg.data.train_files == ["/home/u/data/gsm8k/train.parquet"]
    assert cfg.algorithm.use_kl_in_reward and cfg.algorithm.kl_penalty.name == "k1"
    skipped = {k: why for k, _, why in conv.skipped}
    for key in (
        "actor_rollout_ref.model.use_fused_kernels",
        "actor_rollout_ref.rollout.load_format",
        "actor_rollout_ref.actor.entropy_checkpointing",
        "actor_rollout_ref.actor.use_torch_compile",
    ):
        assert key in skipped, key
    assert any("$@" in n for n in conv.notes)
    assert_every_key_accounted_for(conv, script)


def test_reinforce_pp_slurm_defaults_and_arithmetic(tmp_path):
    conv, cfg, _raw, script = convert_script("reinforce_pp_math_slurm", tmp_path)
    assert cfg.algorithm.advantage.name == "reinforce_plus_plus"
    assert cfg.data.train_batch_size == 128 and cfg.data.max_response_length == 3072
    assert cfg.trainer.micro_batch.max_tokens == (1024 + 3072) * 2
    assert cfg.algorithm.kl_loss.name == "k2"  # verl's mse is k2
    assert cfg.rollout.backend.params.gpu_memory_utilization == 0.6
    assert_every_key_accounted_for(conv, script)
    # the SLURM variables, when the job has them
    conv, _ = from_verl(
        str(SCRIPTS / "reinforce_pp_math_slurm.sh"),
        fixed={"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4"},
    )
    assert conv.get("data.train_batch_size") == 256 and conv.get("placement.trainer.nnodes") == 2


def test_loops_heredoc_and_slices(tmp_path):
    script = SCRIPTS / "grpo_loops_heredoc_slices.sh"
    # the loop over `$(env | awk ...)` may unset HOME, which the data paths read: asked for, not guessed
    with pytest.raises(RlzooError, match=r"\$HOME, which the for loop at line 10 may unset.*--env HOME="):
        from_verl(str(script))
    out = tmp_path / "r.yaml"
    conv, _ = from_verl(str(script), out, fixed={"HOME": "/home/u"})
    cfg = load_config(str(out))
    assert cfg.data.train_files == ["/home/u/data/gsm8k/train.parquet", "/home/u/data/math/train.parquet"]
    assert cfg.data.val_files == ["/home/u/data/gsm8k/test.parquet"]
    assert cfg.rollout.backend.params.tensor_parallel_size == 2  # ${1:-2}
    assert cfg.run.name == "qwen2-7b-tp2"
    assert any("$@" in n for n in conv.notes)
    assert_every_key_accounted_for(conv, script.read_text(), fixed={"HOME": "/home/u"})


def test_remax_torchrun_pipe(tmp_path):
    conv, cfg, _raw, script = convert_script("remax_seq_balance_torchrun", tmp_path)
    assert cfg.algorithm.advantage.name == "remax" and cfg.trainer.backend.params.offload
    assert cfg.trainer.micro_batch.max_tokens == 30000 and not cfg.trainer.val_before_train
    assert "trainer.balance_batch" in {k for k, _, _ in conv.skipped}
    assert_every_key_accounted_for(conv, script)


def test_ppo_critic_megatron_if_elif(tmp_path):
    conv, cfg, _raw, script = convert_script("ppo_critic_megatron", tmp_path)
    tb = cfg.trainer.backend
    assert tb.name == "megatron"  # --config-name='ppo_megatron_trainer.yaml'
    assert (tb.params.tensor_model_parallel_size, tb.params.pipeline_model_parallel_size) == (2, 2)
    assert cfg.algorithm.advantage.name == "gae" and cfg.trainer.optim.critic_lr == 1e-5
    assert cfg.trainer.optim.grad_clip == 1.0  # megatron's clip_grad
    assert "critic.optim.lr_warmup_steps_ratio" in {k for k, _, _ in conv.skipped}  # equals the actor's
    assert_every_key_accounted_for(conv, script)


def test_vl_multiline_value_and_unused_substitution(tmp_path):
    conv, cfg, _raw, script = convert_script("grpo_vl_geo3k_multiline", tmp_path)
    assert cfg.rollout.backend.params.engine_kwargs == {"disable_mm_preprocessor_cache": "True"}
    assert cfg.data.truncation == "filter" and cfg.algorithm.kl_loss_coef == 0.01
    assert any("HOSTNAME_NOW not known" in n for n in conv.notes)
    assert "command substitution" in conv.report()
    assert_every_key_accounted_for(conv, script)


def test_one_step_off_split_pools(tmp_path):
    conv, cfg, _raw, script = convert_script("one_step_off_grpo", tmp_path)
    assert cfg.runner.name == "one_step_off" and cfg.placement.colocate is False
    assert cfg.placement.rollout.n_gpus_per_node == 4 and cfg.trainer.micro_batch.max_tokens == 10240
    assert_every_key_accounted_for(conv, script)


@pytest.mark.parametrize(
    ("loss", "params"),
    [
        ("cispo", {"clip_ratio_low": 10, "clip_ratio_high": 0.2}),
        ("gspo", {"clip_ratio_low": 0.0003, "clip_ratio_high": 0.0004}),
        ("geo_mean", {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}),
        ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}),
    ],
)
def test_policy_losses_cispo_gspo_gmpo_sapo(tmp_path, monkeypatch, loss, params):
    monkeypatch.setenv("LOSS", loss)
    conv, cfg, _raw, script = convert_script("cispo_gspo_gmpo_sapo", tmp_path)
    assert cfg.algorithm.policy_loss.name == loss
    for name, value in params.items():
        assert getattr(cfg.algorithm.policy_loss.params, name) == pytest.approx(value)
    if loss in ("gspo", "geo_mean"):
        assert cfg.algorithm.loss_agg.name == "seq-mean-token-mean"
    assert_every_key_accounted_for(conv, script)


def test_rollout_correction_bypass_and_loss_type(tmp_path, monkeypatch):
    conv, cfg, _raw, script = convert_script("rollout_correction_bypass", tmp_path)
    rc = cfg.algorithm.rollout_correction
    assert rc.name == "rejection" and rc.params.mode == "bypass"
    assert rc.params.criteria == "token_k1,seq_max_k2"  # the escaped Hydra quotes are gone
    assert "algorithm.rollout_correction.loss_type" in {k for k, _, _ in conv.skipped}
    assert_every_key_accounted_for(conv, script)
    monkeypatch.setenv("LOSS_TYPE", "reinforce")  # with rollout_rs: rlzoo's reinforce_is has no rejection
    with pytest.raises(RlzooError, match=r"rollout_rs = .*reinforce_is loss has no rejection sampling"):
        from_verl(str(SCRIPTS / "rollout_correction_bypass.sh"))


def test_bypass_reinforce_becomes_the_reinforce_is_loss():
    base = (
        "algorithm.adv_estimator=rloo actor_rollout_ref.rollout.n=4 data.train_batch_size=8 "
        "actor_rollout_ref.actor.ppo_mini_batch_size=8 algorithm.rollout_correction.bypass_mode=true "
        "algorithm.rollout_correction.loss_type=reinforce "
    )
    conv = convert(
        ov(
            base + "algorithm.rollout_correction.rollout_is=sequence "
            "algorithm.rollout_correction.rollout_is_threshold=2.0 "
            "algorithm.rollout_correction.rollout_is_batch_normalize=true"
        )
    )
    assert conv.get("algorithm.policy_loss") == {
        "name": "reinforce_is",
        "is_level": "sequence",
        "threshold": 2.0,
        "batch_normalize": True,
    }
    assert conv.get("algorithm.rollout_correction") == {"name": "none", "mode": "bypass"}
    plain = convert(ov(base))  # no weights: plain REINFORCE against the rollout
    assert plain.get("algorithm.policy_loss.is_level") == "none"


def test_reward_model_script(tmp_path):
    conv, cfg, _raw, script = convert_script("ppo_reward_model", tmp_path)
    mgr = cfg.reward.manager
    assert mgr.name == "reward_model"
    assert mgr.params.path == "/home/u/models/Skywork-Reward-V2-Llama-3.2-3B" and mgr.params.batch_size == 32
    assert mgr.params.with_scorer == "off"  # verl's rm_scores replace the rule-based score
    assert [k for k, _, _ in conv.manual] == ["reward_model.model.input_tokenizer"]
    skipped = {k for k, _, _ in conv.skipped}
    assert {"reward_model.rollout.gpu_memory_utilization", "reward_model.num_workers"} <= skipped
    assert_every_key_accounted_for(conv, script)


def test_ulysses_maps_to_the_fsdp2_backend(tmp_path):
    conv, cfg, _raw, script = convert_script("fully_async_ulysses", tmp_path)
    assert cfg.trainer.backend.name == "fsdp2" and cfg.trainer.backend.params.ulysses_size == 4
    assert_every_key_accounted_for(conv, script)


def test_ulysses_sizes_that_differ_are_refused():
    act, crit = (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        "critic.ulysses_sequence_parallel_size",
    )
    with pytest.raises(RlzooError, match=r"one trainer\.backend\.ulysses_size; these differ"):
        from_verl(["algorithm.adv_estimator=gae", f"{act}=2", f"{crit}=4"])
    conv = convert(ov(f"algorithm.adv_estimator=grpo {act}=2 {crit}=4"))  # no critic trains: the actor's size
    assert conv.get("trainer.backend.ulysses_size") == 2
    assert crit in [k for k, _, _ in conv.skipped]


def test_dapo_recipe_through_ray_job_submit(tmp_path, monkeypatch):
    monkeypatch.setenv("PWD", "/w")
    conv, cfg, _raw, script = convert_script("dapo_recipe_ray_submit", tmp_path)
    assert cfg.runner.name == "sync"  # recipe.dapo.main_dapo
    rm = cfg.reward.manager
    assert rm.name == "dapo"
    assert (rm.params.enable, rm.params.overlong_buffer_len, rm.params.penalty_factor) == (True, 4096, 1.0)
    assert rm.params.max_response_length == 8192  # recipe/dapo: data.max_response_length
    assert cfg.algorithm.sample_filter.name == "dynamic_sampling"
    assert cfg.model.path == "/home/u/verl/models/Qwen2.5-Math-7B"
    assert cfg.run.dir == "/home/u/verl/ckpts/DAPO/DAPO-Qwen2.5-7B-Math"
    assert ("trainer.resume_mode", "disable") in [(k, v) for k, v, _ in conv.skipped]  # else # comment
    assert_every_key_accounted_for(conv, script)


@pytest.mark.parametrize(
    ("name", "fixed", "refusal"),
    [
        (  # $(pwd) is read as the directory from-verl runs in: no --env needed
            "multiturn_tools",
            {},
            r"multi_turn.enable = True: rlzoo cannot read verl's multi-turn tool configs",
        ),
        (
            "multiturn_tools",
            {"PROJECT_DIR": "/w"},
            r"multi_turn.enable = True: rlzoo cannot read verl's multi-turn tool configs",
        ),
    ],
)
def test_refusals_name_the_missing_feature(name, fixed, refusal):
    with pytest.raises(RlzooError, match=refusal) as e:
        from_verl(str(SCRIPTS / f"{name}.sh"), fixed=fixed)
    assert "no rule" not in str(e.value)


def test_help_example_validates(tmp_path):
    from rlzoo.cli import EXAMPLES

    line = next(x for x in EXAMPLES["from-verl"].replace("\\\n", " ").splitlines() if "adv_estimator" in x)
    words = line.split("#")[0].split()[2:]
    out = tmp_path / "help.yaml"
    assert main(["from-verl", *words, "--out", str(out)]) == 0
    assert main(["validate", str(out)]) == 0


# ---------------------------------------------------------------------------------------------
# every row of the table
# ---------------------------------------------------------------------------------------------
from rlzoo_from_verl.table import Manual, Rule, Skip, To  # noqa: E402

#: a value each rule accepts, where 1 would not do (keys of TABLE; a `.*` row gets `.sub`)
SAMPLE: dict[str, object] = {
    "data.truncation": "left",
    "data.train_files": "/d/t.parquet",
    "data.val_files": "/d/v.parquet",
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "critic.strategy": "fsdp",
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.model.torch_dtype": "bf16",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
    "trainer.logger": "['console']",
    "actor_rollout_ref.actor.optim.betas": "[0.9,0.95]",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "bf16",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype": "fp32",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": "fp32",
    "actor_rollout_ref.actor.router_replay.*": "disabled",
    "actor_rollout_ref.actor.optim.lr_warmup_init": 0,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "algorithm.adv_estimator": "grpo",
    "algorithm.kl_penalty": "kl",
    "reward_model.reward_manager": "naive",
    "actor_rollout_ref.actor.optim.warmup_style": "constant",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.actor.optim.lr_decay_style": "constant",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.rollout_correction.*": None,
    "critic.optim.betas": "[0.9,0.95]",
    "reward_model.enable": False,
}
#: the value of a Skip row with `when` that it refuses
REFUSED = {"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "fp32"}
_OFF_FEATURES = [k for k, r in TABLE.items() if isinstance(r, Skip) and r.when is not None]


def _row_key(key: str) -> str:
    return key[:-2] + ".sub" if key.endswith(".*") else key


def _report_of(key: str, value: object):
    words = [f"{_row_key(key)}={value}"]
    if key.startswith("critic.optim."):
        words.append(f"actor_rollout_ref.actor.optim.{key.rsplit('.', 1)[1]}={value}")
    return convert(ov(" ".join(words)))


@pytest.mark.parametrize("key", [k for k, r in TABLE.items() if isinstance(r, To)])
def test_every_to_row_sets_its_rlzoo_key(key):
    rule = TABLE[key]
    value = SAMPLE.get(key, 1)
    conv = _report_of(key, value)
    expected = rule.how(parse_value(str(value))) if rule.how else parse_value(str(value))
    assert conv.get(rule.key) == expected
    assert any(m[0] == _row_key(key) and m[2] == rule.key for m in conv.mapped)


@pytest.mark.parametrize("key", [k for k, r in TABLE.items() if isinstance(r, Skip)])
def test_every_not_needed_row_says_why(key):
    rule = TABLE[key]
    value = SAMPLE.get(key, 1)
    if rule.when is not None and key not in SAMPLE:  # a value the row accepts
        value = next(c for c in (0, 1, False, "null") if rule.when(parse_value(str(c))))
    conv = _report_of(key, value)
    assert (_row_key(key), parse_value(str(value)), rule.why) in conv.skipped


@pytest.mark.parametrize("key", _OFF_FEATURES)
def test_every_conditional_row_refuses_the_feature_by_name(key):
    rule = TABLE[key]
    value = REFUSED.get(key, "on_value")
    with pytest.raises(RlzooError) as e:
        _report_of(key, value)
    assert rule.otherwise in str(e.value) and rule.otherwise and "no rule" not in rule.otherwise


@pytest.mark.parametrize("key", [k for k, r in TABLE.items() if isinstance(r, Manual)])
def test_every_manual_row_is_written_into_the_recipe(key):
    conv = _report_of(key, 1)
    assert [(k, why) for k, _, why in conv.manual] == [(_row_key(key), TABLE[key].why)]
    assert "MANUAL STEP" in render(conv, "x")


@pytest.mark.parametrize("key", [k for k, r in TABLE.items() if isinstance(r, Rule)])
def test_every_combined_row_accounts_for_its_key(key):
    value = SAMPLE.get(key, 1)
    try:
        conv = _report_of(key, value)
    except RlzooError as e:  # a refusal must name what is missing, never "no rule"
        assert _row_key(key) in str(e) and "no rule" not in str(e)
        return
    assert _row_key(key) in conv.report()


def test_lora_script_maps_to_trainer_lora(tmp_path):
    """verl's LoRA (``actor_rollout_ref.model.lora_rank/lora_alpha/target_modules``) is rlzoo's
    ``trainer.lora`` (issue 22); the recipe validates."""
    conv, cfg, raw, script = convert_script("grpo_lora", tmp_path)
    assert raw["trainer"]["lora"] == {"rank": 64, "alpha": 32.0, "target_modules": ["all-linear"]}
    assert (cfg.trainer.lora.rank, cfg.trainer.lora.alpha) == (64, 32.0)
    assert cfg.trainer.lora.target_modules == ("all-linear",)
    assert_every_key_accounted_for(conv, script)


def test_lora_keys_verl_defaults_lists_and_refusals():
    m = "actor_rollout_ref.model."
    conv = convert(ov(f"{m}lora_rank=8 {m}target_modules=[q_proj,v_proj]"))
    assert conv.get("trainer.lora") == {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"]}
    conv = convert(ov(f"{m}lora_rank=0 {m}lora_alpha=32"))  # off: full fine-tuning, alpha not needed
    assert conv.get("trainer.lora") is None
    assert (f"{m}lora_alpha", 32, "LoRA is off (lora_rank=0)") in conv.skipped
    # exclude_modules: a regular expression as given (peft matches it whole), or names as peft matches a list
    conv = convert(ov(f"{m}lora_rank=8 {m}exclude_modules=.*visual.*"))
    assert conv.get("trainer.lora.exclude_modules") == ".*visual.*"
    conv = convert(ov(f"{m}lora_rank=8 {m}exclude_modules=[o_proj,mlp.down_proj]"))
    pattern = conv.get("trainer.lora.exclude_modules")
    import re

    hits = ["model.layers.0.self_attn.o_proj", "o_proj", "model.layers.3.mlp.down_proj"]
    misses = ["model.layers.0.self_attn.xo_proj", "model.layers.0.mlp.up_proj", "o_proj.x"]
    assert all(re.fullmatch(pattern, n) for n in hits) and not any(re.fullmatch(pattern, n) for n in misses)
    with pytest.raises(RlzooError, match="expected a regular expression or a list of module names"):
        convert(ov(f"{m}lora_rank=8 {m}exclude_modules=(unclosed"))
    # an adapter that is not there yet: the recipe's rank / alpha / targets (validate checks them)
    conv = convert(ov(f"{m}lora_rank=8 {m}lora_adapter_path=/ckpt/adapter"))
    assert conv.get("trainer.lora") == {
        "rank": 8,
        "alpha": 16.0,
        "target_modules": ["all-linear"],
        "adapter_path": "/ckpt/adapter",
    }
    with pytest.raises(RlzooError, match="megatron LoRA settings"):
        convert(ov(f"{m}lora_rank=8 {m}lora.type=dora"))


def test_a_bad_value_says_what_would_be_right():
    with pytest.raises(RlzooError, match=r"betas 1: expected two numbers, e.g. \[0.9,0.999\]"):
        convert(ov("actor_rollout_ref.actor.optim.betas=1"))


def test_an_unknown_key_is_the_only_no_rule():
    with pytest.raises(RlzooError, match=r"foo.bar = 1: no rule"):
        convert(ov("foo.bar=1"))


_VALUES = st.one_of(
    st.integers(-3, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        ["True", "False", "null", "/x", "", "[1,2]", "['a']", "{a: 1}", "0.5_2.0", "token", "'q'"]
    ),
    st.text(max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(TABLE)), _VALUES), max_size=8))
def test_any_values_of_known_keys_give_a_result_or_its_own_error(pairs):
    command = parse_overrides([f"{k.replace('.*', '.sub')}={v}" for k, v in pairs])
    with contextlib.suppress(RlzooError):  # anything else (TypeError, ...) fails the test
        convert(command)


def test_cli_env_fixes_a_variable_and_prints_what_was_not_run(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(
        "NOW=$(id -u)\nHOST=`hostname`\n"
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 "
        "data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.experiment_name=run_$NOW\n"
    )
    out = tmp_path / "r.yaml"
    assert main(["from-verl", str(script), "--out", str(out)]) != 0
    assert "--env NOW=VALUE" in capsys.readouterr().err
    assert main(["from-verl", str(script), "--env", "NOW=42", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "trainer.experiment_name = 'run_42'  ->  run.name = 'run_42'" in printed
    assert "read from the script without running it:" in printed and "HOST not known" in printed
    assert main(["from-verl", str(script), "--env", "NOW"]) != 0
    assert "--env 'NOW': expected NAME=VALUE" in capsys.readouterr().err


def test_sglang_and_trtllm_scripts_run_on_the_vllm_backend_and_say_so():
    base = "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 data.train_batch_size=8 "
    base += "actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.rollout.tensor_model_parallel_size=2 "
    conv = convert(ov(base + "actor_rollout_ref.rollout.name=sglang"))
    assert conv.get("rollout.backend.name") == "vllm"
    assert conv.get("rollout.backend.tensor_parallel_size") == 2
    assert any(n.startswith("SGLang -> vLLM: rlzoo has no SGLang backend") for n in conv.notes)
    assert "SGLang -> vLLM" in conv.report()
    trt = convert(ov(base + "actor_rollout_ref.rollout.name=trtllm"))
    assert trt.get("rollout.backend.name") == "vllm"
    assert any(n.startswith("TensorRT-LLM -> vLLM") for n in trt.notes)
    plain = convert(ov(base + "actor_rollout_ref.rollout.name=vllm"))
    assert plain.recipe == conv.recipe and not any("SGLang" in n for n in plain.notes)


PPO = (
    "algorithm.adv_estimator=gae actor_rollout_ref.rollout.n=1 data.train_batch_size=8 "
    "actor_rollout_ref.actor.ppo_mini_batch_size=8 critic.optim.lr=1e-5 "
)


def test_the_critic_keeps_its_own_schedule():
    # verl: the actor warms up over 10% of the steps, the critic (its own defaults) not at all
    conv = convert(ov(PPO + "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"))
    assert conv.get("trainer.optim.warmup_ratio") == 0.1
    assert conv.get("trainer.optim.critic_warmup_ratio") == 0.0
    conv = convert(
        ov(
            PPO
            + "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1 critic.optim.lr_warmup_steps_ratio=0.05 "
            "critic.optim.warmup_style=cosine critic.optim.min_lr_ratio=0.1"
        )
    )
    assert conv.get("trainer.optim.critic_warmup_ratio") == 0.05
    assert conv.get("trainer.optim.critic_lr_scheduler") == "cosine"
    assert conv.get("trainer.optim.critic_min_lr_ratio") == 0.1
    conv = convert(ov(PPO + "critic.optim.lr_warmup_steps=5 critic.optim.lr_warmup_steps_ratio=0.3"))
    assert conv.get("trainer.optim.critic_warmup_steps") == 5  # steps win over the ratio, as in verl
    assert conv.get("trainer.optim.critic_warmup_ratio") is None
    # equal to what the critic would take from the actor: nothing to set
    conv = convert(ov(PPO + "critic.optim.warmup_style=constant critic.optim.lr_warmup_steps_ratio=0.0"))
    assert conv.get("trainer.optim") == {"critic_lr": 1e-5}
    with pytest.raises(RlzooError, match=r"critic.optim.betas = \[0.9, 0.95\]: rlzoo's AdamW betas are one"):
        convert(ov(PPO + "critic.optim.betas=[0.9,0.95]"))
    # the recipe validates: the critic's settings exist in trainer.optim
    from rlzoo.kernel.settings import OptimSettings

    optim = convert(ov(PPO + "critic.optim.warmup_style=linear")).get("trainer.optim")
    assert OptimSettings(**optim).critic_lr_scheduler == "linear"


def test_a_custom_reward_function_file_becomes_the_python_file_scorer(tmp_path, monkeypatch):
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "mine.py").write_text(
        "def my_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
        "    return scale * float(solution_str.strip() == str(ground_truth))\n"
    )
    monkeypatch.chdir(tmp_path)  # verl runs from the checkout's root; relative paths are resolved there
    conv = convert(
        ov(
            "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 data.train_batch_size=8 "
            "actor_rollout_ref.actor.ppo_mini_batch_size=8 custom_reward_function.path=rewards/mine.py "
            "custom_reward_function.name=my_score +custom_reward_function.reward_kwargs.scale=2.0"
        )
    )
    assert conv.get("reward.scorer") == {
        "name": "python_file",
        "path": str(tmp_path / "rewards" / "mine.py"),
        "function": "my_score",
        "kwargs": {"scale": 2.0},
    }
    from rlzoo.algorithms.functional.scoring.user_file import compute_score
    from rlzoo.algorithms.scorers import PythonFileParams

    params = PythonFileParams(**{k: v for k, v in conv.get("reward.scorer").items() if k != "name"})
    assert compute_score(" 42 ", 42, "x", {}, params) == 2.0
    off = convert(
        ov("algorithm.adv_estimator=grpo custom_reward_function.path=null custom_reward_function.name=f")
    )
    assert off.get("reward.scorer") is None
    assert (
        "custom_reward_function.name",
        "f",
        "no custom reward function (custom_reward_function.path unset)",
    ) in off.skipped


def test_chat_template_arguments_reach_the_recipe():
    conv = convert(
        ov(
            "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 data.train_batch_size=8 "
            "actor_rollout_ref.actor.ppo_mini_batch_size=8 +data.apply_chat_template_kwargs.reasoning_effort=medium "
            "+data.apply_chat_template_kwargs.enable_thinking=False"
        )
    )
    assert conv.get("data.chat_template_kwargs") == {"reasoning_effort": "medium", "enable_thinking": False}


def test_sandbox_fusion_maps_to_code_tests_on_that_server(tmp_path):
    """verl's code sources score on the SandboxFusion server (reward_model.sandbox_fusion.*): rlzoo's
    code_tests scorer speaks the same /run_code, so they map to reward.scorers with sandbox.url."""
    script = (SCRIPTS / "run_qwen2-7b_gsm8k_grpo.sh").read_text()
    script = script.replace(
        "trainer.total_epochs=15 $@",
        "reward_model.sandbox_fusion.url='http://10.0.0.5:8080/run_code' \\\n"
        "    reward_model.sandbox_fusion.memory_limit_mb=1024 \\\n"
        "    reward_model.sandbox_fusion.max_concurrent=32 \\\n"
        "    trainer.total_epochs=15",
    )
    src = tmp_path / "code.sh"
    src.write_text(script)
    out = tmp_path / "code.yaml"
    conv, _text = from_verl(str(src), out)
    cfg = load_config(str(out))
    for source in ("codecontests", "apps", "codeforces", "taco"):
        scorer = cfg.reward.scorers[source]
        assert scorer.name == "code_tests"
        sandbox = scorer.params.sandbox
        assert (sandbox.url, sandbox.memory_mb, sandbox.max_parallel) == (
            "http://10.0.0.5:8080/run_code",
            1024,
            32,
        )
    assert_every_key_accounted_for(conv, script)


def test_verls_prime_manager_is_the_process_pool_with_its_timeout():
    conv = convert(
        ov(
            "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 data.train_batch_size=8 "
            "actor_rollout_ref.actor.ppo_mini_batch_size=8 reward_model.reward_manager=prime"
        )
    )
    assert conv.get("reward.manager") == {"name": "process_pool", "timeout": 300.0}
    assert any(n.startswith("prime -> process_pool") for n in conv.notes)


def test_rollout_and_validation_data_dirs_keep_samples():
    """verl dumps rollouts into ``trainer.rollout_data_dir`` (validation ones into
    ``validation_data_dir``) when set: rlzoo keeps them in RUN_DIR/samples/ (run.samples)."""
    conv = convert(ov("algorithm.adv_estimator=grpo trainer.rollout_data_dir=/tmp/rollouts"))
    assert conv.get("run.samples.every") == 1
    conv = convert(
        ov("algorithm.adv_estimator=grpo trainer.rollout_data_dir=null trainer.validation_data_dir=/tmp/v")
    )
    assert conv.get("run.samples.every") == 0 and conv.get("run.samples.val") is True


def test_an_existing_lora_adapter_gives_its_own_settings(tmp_path, monkeypatch):
    """verl loads lora_adapter_path with PeftModel.from_pretrained: the adapter's r / lora_alpha /
    target_modules win over lora_rank / lora_alpha / target_modules, and the adapter alone turns LoRA on."""
    import json

    m = "actor_rollout_ref.model."
    (tmp_path / "ad").mkdir()
    (tmp_path / "ad" / "adapter_config.json").write_text(
        json.dumps({"r": 4, "lora_alpha": 8, "target_modules": ["v_proj", "q_proj"]})
    )
    monkeypatch.chdir(tmp_path)
    conv = convert(ov(f"{m}lora_rank=0 {m}lora_alpha=32 {m}lora_adapter_path=ad"))
    assert conv.get("trainer.lora") == {
        "rank": 4,
        "alpha": 8.0,
        "target_modules": ["v_proj", "q_proj"],
        "adapter_path": str(tmp_path / "ad"),
    }
    assert any(k == f"{m}lora_alpha" and "adapter_config.json gives it" in why for k, _, why in conv.skipped)
    off = convert(ov(f"{m}lora_rank=0 {m}lora_adapter_path=null"))
    assert off.get("trainer.lora") is None
    # not there yet and no lora_rank: rlzoo's default rank, said; validate checks it against the adapter
    conv = convert(ov(f"{m}lora_rank=0 {m}lora_adapter_path=/nowhere"))
    assert conv.get("trainer.lora.rank") == 16 and conv.get("trainer.lora.adapter_path") == "/nowhere"
    assert any("has no adapter_config.json here" in n for n in conv.notes)


def test_a_custom_dataset_class_and_sampler_map_to_data_custom_cls_and_data_sampler(tmp_path, monkeypatch):
    (tmp_path / "my").mkdir()
    (tmp_path / "my" / "data.py").write_text(
        "class D:\n    def __init__(self, data_files, tokenizer, config, processor=None):\n        pass\n"
    )
    (tmp_path / "my" / "sampler.py").write_text(
        "class S:\n    def __init__(self, data_source, data_config):\n        pass\n"
    )
    monkeypatch.chdir(tmp_path)
    conv = convert(
        ov(
            "algorithm.adv_estimator=grpo data.custom_cls.path=my/data.py data.custom_cls.name=D "
            "+data.sampler.class_path=my/sampler.py +data.sampler.class_name=S"
        )
    )
    assert conv.get("data.custom_cls") == {"path": str(tmp_path / "my" / "data.py"), "name": "D"}
    assert conv.get("data.sampler") == {"path": str(tmp_path / "my" / "sampler.py"), "name": "S"}
    from rlzoo.data.user_file import UserDatasetSettings, UserSamplerSettings

    UserDatasetSettings(**conv.get("data.custom_cls"))  # what validate checks passes
    UserSamplerSettings(**conv.get("data.sampler"))
    off = convert(ov("algorithm.adv_estimator=grpo data.custom_cls.path=null data.custom_cls.name=null"))
    assert off.get("data.custom_cls") is None
    with pytest.raises(RlzooError, match=r"a pkg:// module path is imported through sys\.path"):
        convert(ov("+data.sampler.class_path=pkg://tests.utils.x +data.sampler.class_name=S"))


def test_over_sample_rate_is_read_as_verl_reads_it_now():
    """verl 0.9 declares ``rollout.over_sample_rate`` but no code reads it (the SGLang SPMD rollout
    that used it was retired): a script setting it converts, and the reason is listed."""
    conv = convert(ov("algorithm.adv_estimator=grpo actor_rollout_ref.rollout.over_sample_rate=0.1"))
    assert not conv.unmappable
    (why,) = [w for k, _, w in conv.skipped if k.endswith("over_sample_rate")]
    assert "no code reads it" in why and "#4422" in why


def test_a_frozen_vision_tower_points_to_the_native_setting():
    with pytest.raises(
        RlzooError, match=r"freeze_vision_tower = True: .*trainer\.backend\.freeze_vision_tower"
    ):
        convert(ov("algorithm.adv_estimator=grpo actor_rollout_ref.actor.freeze_vision_tower=True"))
