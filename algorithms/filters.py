"""Built-in filters parts (being written)."""
