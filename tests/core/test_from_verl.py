"""`rlzoo from-verl`: verl launch scripts (fixtures in verl's syntax) -> recipes `validate` accepts,
with the same algorithm, batch, async and placement knobs; every verl key accounted for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlzoo.cli import main
from rlzoo.config import load_config
from rlzoo.errors import RlzooError
from rlzoo.from_verl import TABLE, VERL_DEFAULTS, convert, from_verl, parse_command, table_markdown
from rlzoo.from_verl.shell import _expand, _words

SCRIPTS = Path(__file__).parent / "verl_scripts"
ENV = {"HOME": "/home/u", "DATA_HOME": "/data"}


@pytest.fixture(autouse=True)
def _fixed_env(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("MODEL_PATH", "TRAIN_FILE", "TEST_FILE", "NNODES", "NGPUS_PER_NODE", "HF_MODEL_PATH"):
        monkeypatch.delenv(k, raising=False)


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


def assert_every_key_accounted_for(conv, script: str) -> None:
    cmd = parse_command(script, ENV)
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
    conv = convert(parse_command("algorithm.adv_estimator=grpo data.train_batch_size=64", ENV))
    assert conv.recipe["runner"] == {"name": "sync"}
    assert conv.get("data.train_batch_size") == 64
    assert conv.get("rollout.n") == 1 and conv.get("data.max_response_length") == 512  # verl defaults
    assert conv.get("trainer.total_epochs") == 30
    tagged = [m for m in conv.mapped if m[0] == "data.max_response_length"]
    assert tagged and "verl default" in tagged[0][4]
    conv = convert(
        parse_command("async_training.require_batches=2 actor_rollout_ref.actor.ppo_mini_batch_size=8")
    )
    assert conv.recipe["runner"]["name"] == "fully_async" and conv.get("data.train_batch_size") == 16


def test_unmappable_keys_fail_with_the_full_list():
    with pytest.raises(RlzooError) as e:
        from_verl(["algorithm.adv_estimator=grpo", "foo.bar=1", "actor_rollout_ref.rollout.name=sglang"])
    msg = str(e.value)
    assert "2 verl key(s) cannot be mapped" in msg and "foo.bar" in msg and "sglang" in msg
    with pytest.raises(RlzooError, match="Ulysses"):
        from_verl(["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    with pytest.raises(RlzooError, match="no `python -m verl"):
        parse_command("echo hello")


def test_rollout_correction_and_filter_groups_mapping():
    conv = convert(
        parse_command(
            "algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0 "
            "algorithm.rollout_correction.rollout_rs=token_k1,seq_mean_k3 "
            "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0,0.01 "
            "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4 "
            "algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc "
            "algorithm.filter_groups.max_num_gen_batches=10",
            ENV,
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
        parse_command(
            "algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=0.5_5.0"
        )
    )
    assert icepop.get("algorithm.rollout_correction")["name"] == "icepop"


def test_policy_loss_params_only_where_the_loss_declares_them():
    conv = convert(
        parse_command(
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
        parse_command(
            "actor_rollout_ref.actor.policy_loss.loss_mode=dro actor_rollout_ref.actor.policy_loss.dro_beta=0.2"
        )
    )
    assert dro.get("algorithm.policy_loss.beta") == 0.2


def test_shell_expansion():
    env = {"A": "x", "N": "3", "EMPTY": ""}
    assert _expand('${A:-d}/${B:-"$A-def"}/${EMPTY:-e}/${EMPTY-f}', env) == "x/x-def/e/"
    assert _expand("$((N * (2 + 1)))-$((1024 * 8))", env) == "9-8192"
    assert _words("a=\"$A b\" c='$A' d=$A $@ e # comment", env) == ["a=x b", "c=$A", "d=x", "e"]
    script = 'X=1\nif [ "$X" = "1" ]; then\n  Y=yes\nelse\n  Y=no\nfi\npython3 -m verl.trainer.main_ppo \\\n  trainer.experiment_name=$Y'
    cmd = parse_command(script, {})
    assert cmd.entry == "verl.trainer.main_ppo" and cmd.overrides == [("trainer.experiment_name", "yes")]


def test_cli_writes_a_recipe_validate_accepts(tmp_path, capsys):
    out = tmp_path / "grpo.yaml"
    assert main(["from-verl", str(SCRIPTS / "run_qwen2-7b_gsm8k_grpo.sh"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "actor_rollout_ref.rollout.n = 5  ->  rollout.n = 5" in printed
    assert main(["validate", str(out)]) == 0


def test_docs_show_the_mapping_table():
    doc = (Path(__file__).parents[2] / "docs" / "from-verl.md").read_text()
    assert table_markdown() in doc, "docs/from-verl.md is stale: paste rlzoo.from_verl.table_markdown()"
    assert set(VERL_DEFAULTS) <= set(TABLE)
