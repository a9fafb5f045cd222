"""AIME 2024 (``BytedTsinghua-SIA/AIME-2024``) -> rlzoo's schema: DAPO's validation set.

Same verl layout as DAPO-Math-17k (see :mod:`rlzoo.tasks.prepare.dapo_math`), kept as is. The one
upstream split, ``train``, is written as ``test.parquet`` by default (``splits: ['train:test']``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlzoo.tasks.datasets import Aime2024Params
from rlzoo.tasks.prepare._common import bind_params
from rlzoo.tasks.prepare.dapo_math import prepare_verl_layout

NAME = "aime2024"


def prepare(out_dir: Path, params: Any = None) -> dict[str, Path]:
    """Write AIME 2024 in rlzoo's schema; returns ``{split: parquet path}``."""
    return prepare_verl_layout(out_dir, bind_params(params, Aime2024Params, NAME), NAME)
