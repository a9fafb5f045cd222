"""TextArena's single-player text games as a multi-turn ``environment``, and a dataset of games.

`TextArena <https://github.com/LeonGuertler/TextArena>`_ ships ~100 text games (Guess The Number,
Tower of Hanoi, Sudoku, Minesweeper, Mastermind, FrozenLake, ...; 180 single-player ids with their
variants) that run offline in pure Python. Install it with the extra: ``pip install rlzoo[textarena]``.

Dataset ``textarena``: one row per game (an env id and a seed), its prompt the game's first
observation. Environment ``textarena``: plays that game turn by turn -- each model turn is the
player's action, the game's messages are the next observation, and the game's own reward (on
its last turn) is the trajectory's.

Import-light: the params and the registration only; the code is in :mod:`rlzoo.tasks._textarena`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param
from rlzoo.kernel.params import MAX_SEED

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import EnvironmentFactory
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._textarena"
_NEEDS = {"requires": "textarena", "extra": "textarena"}


@dataclass(frozen=True)
class TextArenaDataParams:
    """Rows of TextArena games: ``train_size`` + ``val_size`` seeds of one single-player game.

    Training games use seeds ``seed .. seed + train_size - 1``, validation games seeds from
    ``seed + 1_000_000`` on (different seeds; a game with few distinct states may still repeat
    one). The prompt is the game's first observation at that seed; ``extra_info`` holds
    ``env_id`` and ``seed``, which the ``textarena`` environment plays.
    """

    env_id: str = param(
        "GuessTheNumber-v0",
        help="a single-player TextArena env id (python -m rlzoo.tasks._textarena lists them)",
    )
    train_size: int = param(1000, ge=1, help="training games")
    val_size: int = param(64, ge=1, help="held-out validation games")
    seed: int = param(0, ge=0, le=MAX_SEED, help="first training seed (validation: from seed + 1_000_000)")
    overwrite: bool = param(False, help="rebuild even when the files exist")


@dataclass(frozen=True)
class TextArenaEnvParams:
    """A TextArena game, one per trajectory: the row's ``extra_info`` ``env_id`` at its ``seed``.

    ``reset`` starts the game (``num_players=1``) and returns its first observation as a user
    message. ``step`` passes the model's turn to the game as the action (TextArena's own parser
    reads it, e.g. ``[5]``; an invalid move is the game's business: it says so or ends the game)
    and returns the game's messages since the last turn (the player's own action echo left out);
    when the game ends, the reward is the one TextArena's ``close()`` gives the player (e.g. 1.0
    for a win; some games grade partial progress). Unfinished games (the rollout's ``max_turns``)
    earn 0. Info: ``invalid_move`` and ``won`` (reward >= 1) as ``agent/env/*`` metrics.
    Wrappers of the env id are not applied (the rollout keeps the conversation; TextArena's LLM
    wrappers would repeat the whole history each turn).
    """

    env_id: str = param("", help="play this env id instead of the row's extra_info env_id ('' : the row's)")


_TEXT = {"modalities": ("text",), **_NEEDS}


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    registry.register("textarena", f"{_IMPL}:prepare", params=TextArenaDataParams, capabilities=_TEXT)


@hookimpl
def rlzoo_register_environments(registry: Registrar[EnvironmentFactory]) -> None:
    registry.register("textarena", f"{_IMPL}:make_env", params=TextArenaEnvParams, capabilities=_NEEDS)
