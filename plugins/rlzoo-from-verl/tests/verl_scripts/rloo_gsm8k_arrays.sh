#!/usr/bin/env bash
# Fixture in verl's syntax modelled on verl's examples/rloo_trainer scripts (RLOO, FSDP, vLLM),
# written for rlzoo's tests: arrays of overrides, ${X:-default}, export, "$@".
set -xeuo pipefail
export VLLM_USE_V1=1

MODEL_PATH=${MODEL_PATH:-"${HOME}/models/Qwen2-7B-Instruct"}
NGPUS=${NGPUS:-8}
DATA=(
    data.train_files="['$HOME/data/gsm8k/train.parquet']"   # one file, as a Hydra list
    data.val_files="['$HOME/data/gsm8k/test.parquet']"
    data.train_batch_size=1024
    data.max_prompt_length=512
    data.max_response_length=1024
)
ACTOR=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.torch_dtype=bfloat16
    actor_rollout_ref.model.use_fused_kernels=False
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=256
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_checkpointing=True
)
ACTOR+=(actor_rollout_ref.actor.use_torch_compile=False)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=rloo \
    "${DATA[@]}" \
    "${ACTOR[@]}" \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.load_format=dummy \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_penalty=kl \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name=verl_rloo_example_gsm8k \
    trainer.experiment_name=qwen2_7b_rloo \
    trainer.n_gpus_per_node=$NGPUS \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 "$@"
