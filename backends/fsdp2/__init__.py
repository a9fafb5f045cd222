"""The fsdp2 backend plugin (being written)."""
