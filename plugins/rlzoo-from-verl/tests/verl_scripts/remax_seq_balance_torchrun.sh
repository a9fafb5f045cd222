# Fixture in verl's syntax modelled on verl's examples/remax_trainer scripts, written for rlzoo's
# tests: torchrun as the launcher, a pipe to tee, `&&` before the launch.
set -x
export HYDRA_FULL_ERROR=1
LOG_DIR=${LOG_DIR:-logs}

mkdir -p "$LOG_DIR" && torchrun --standalone --nnodes 1 --nproc_per_node 8 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=remax \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=512 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000 \
    actor_rollout_ref.actor.fsdp_config.param_offload=True \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.layered_summon=False \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_penalty=kl \
    trainer.balance_batch=True \
    trainer.val_before_train=False \
    trainer.total_epochs=5 2>&1 | tee "$LOG_DIR/remax.log"
