# Fixture in verl's syntax modelled on verl's experimental one_step_off_policy scripts, written for
# rlzoo's tests: a separate rollout pool, hybrid_engine=False, an `if` on a string test.
set -xeuo pipefail
train_prompt_bsz=128
n_resp_per_prompt=8
NGPUS_TRAIN=${NGPUS_TRAIN:-4}
NGPUS_ROLLOUT=${NGPUS_ROLLOUT:-4}
use_dynamic_bsz=True
if [ "$use_dynamic_bsz" = "True" ]; then
    token_budget=$(( (2048 + 8192) * 1 ))
fi

python3 -m verl.experimental.one_step_off_policy.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/dapo-math-17k.parquet \
    data.val_files=$HOME/data/aime-2024.parquet \
    data.train_batch_size=$train_prompt_bsz \
    data.max_prompt_length=2048 \
    data.max_response_length=8192 \
    actor_rollout_ref.model.path=$HOME/models/Qwen2.5-Math-7B \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=$use_dynamic_bsz \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$token_budget \
    actor_rollout_ref.rollout.n=$n_resp_per_prompt \
    actor_rollout_ref.rollout.mode=async \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=$NGPUS_TRAIN \
    rollout.nnodes=1 \
    rollout.n_gpus_per_node=$NGPUS_ROLLOUT \
    trainer.total_epochs=10
