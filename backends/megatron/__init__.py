"""The megatron backend plugin (being written)."""
