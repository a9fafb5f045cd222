"""Tasks shipped with rlzoo (synthetic data + scorers that need no download)."""
