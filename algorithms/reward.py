"""Built-in reward parts (being written)."""
