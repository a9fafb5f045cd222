"""The build stamp of a task's prepared files (``NAME_params.json``): the params the files were built
with, so a cache written by other params (or an older task) is rebuilt rather than reused."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class BuildStamp:
    def __init__(self, out: Path, name: str, params: Any, **built: Any) -> None:
        """``built``: what the files are besides the params (``model="llama"``): a cache written
        before the task changed it is rebuilt too."""
        self.path = Path(out) / f"{name}_params.json"
        fields = dataclasses.asdict(params)
        key = {k: v for k, v in fields.items() if k != "overwrite"}
        key.update({f"_{k}": v for k, v in built.items()})
        self.key = json.dumps(key, sort_keys=True)
        self.overwrite = bool(fields.get("overwrite", False))

    def current(self, files: Iterable[Path]) -> bool:
        """The files exist, were built with these params, and no rebuild was asked for."""
        fresh = self.path.exists() and self.path.read_text() == self.key
        return not self.overwrite and fresh and all(p.exists() for p in files)

    def write(self) -> None:
        """Record the params, once the files are complete."""
        self.path.write_text(self.key)
