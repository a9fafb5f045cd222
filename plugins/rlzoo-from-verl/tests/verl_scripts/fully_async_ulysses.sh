# Fixture in verl's syntax modelled on verl's experimental fully_async_policy dapo_7b_math_fsdp2_*
# scripts, written for rlzoo's tests: Ulysses sequence parallelism (-> trainer.backend.ulysses_size).
set -xeuo pipefail
sp_size=4
python -m verl.experimental.fully_async_policy.fully_async_main \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=0 \
    data.train_files=$HOME/data/dapo-math-17k.parquet \
    actor_rollout_ref.model.path=$HOME/models/Qwen2.5-Math-7B \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=${sp_size} \
    actor_rollout_ref.ref.ulysses_sequence_parallel_size=${sp_size} \
    actor_rollout_ref.rollout.n=16 \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=4 \
    rollout.nnodes=1 \
    rollout.n_gpus_per_node=4 \
    rollout.total_rollout_steps=51200 \
    async_training.staleness_threshold=0.1 \
    async_training.trigger_parameter_sync_step=4 \
    async_training.require_batches=4 \
    async_training.partial_rollout=True
