"""Built-in correction parts (being written)."""
