# Fixture in verl's syntax modelled on verl's examples/ppo_trainer run_qwen2-7b_rm*.sh scripts
# (PPO, a critic and a learned reward model), written for rlzoo's tests.
set -x
train_files="['$HOME/data/hh_rlhf/train.parquet']"
test_files="['$HOME/data/hh_rlhf/test.parquet']"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    data.train_files="$train_files" \
    data.val_files="$test_files" \
    data.train_batch_size=256 \
    data.max_prompt_length=1024 \
    data.max_response_length=512 \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$HOME/models/Qwen2-7B-Instruct" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.n=1 \
    critic.optim.lr=1e-5 \
    critic.optim.lr_warmup_steps_ratio=0.1 \
    critic.model.path="$HOME/models/Qwen2-7B-Instruct" \
    critic.ppo_micro_batch_size_per_gpu=8 \
    reward_model.enable=True \
    reward_model.model.path="$HOME/models/Skywork-Reward-V2-Llama-3.2-3B" \
    reward_model.use_reward_loop=True \
    reward_model.rollout.name=vllm \
    reward_model.rollout.gpu_memory_utilization=0.8 \
    reward_model.rollout.prompt_length=4096 \
    reward_model.rollout.response_length=4096 \
    reward_model.num_workers=8 \
    reward_model.micro_batch_size_per_gpu=32 \
    trainer.n_gpus_per_node=8 \
    trainer.total_epochs=15
