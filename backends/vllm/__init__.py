"""The vllm backend plugin (being written)."""
