"""rlzoo's version (``pyproject.toml`` says the same; a test keeps the two equal)."""

__version__ = "0.1.0"
