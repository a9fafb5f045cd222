"""Built-in native backends (being written)."""
