"""The ``textarena`` dataset and environment (see :mod:`rlzoo.tasks.textarena`)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError, import_optional
from rlzoo.kernel.protocols import AgentTurn, EnvStep, Message, Tool
from rlzoo.tasks._stamp import build_splits

DATA_SOURCE_PREFIX = "textarena/"
VAL_SEED_OFFSET = 1_000_000


class TextArenaError(RlzooError, ValueError):
    """A TextArena game cannot be played as asked; the message says why."""


def env_ids() -> list[str]:
    """Every env id TextArena registers (single- and multi-player)."""
    from textarena.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


def start(env_id: str, seed: int) -> tuple[Any, int, list[Any]]:
    """The unwrapped game of ``env_id`` reset at ``seed`` for one player: (env, player id, observation)."""
    ta = import_optional(
        "textarena",
        "the textarena dataset and environment need the textarena package: pip install rlzoo[textarena]",
        TextArenaError,
    )
    if env_id not in env_ids():
        near = difflib.get_close_matches(env_id, env_ids(), n=6)
        raise TextArenaError(
            f"TextArena has no env {env_id!r}"
            + (f"; similar: {', '.join(near)}" if near else "")
            + " (python -m rlzoo.tasks._textarena lists them)"
        )
    env = ta.make(env_id)
    while hasattr(env, "env"):  # TextArena's wrappers: the rollout keeps the conversation itself
        env = env.env
    try:
        env.reset(num_players=1, seed=int(seed))
    except (AssertionError, ValueError) as exc:
        raise TextArenaError(
            f"TextArena env {env_id!r} is not a single-player game ({exc}); the textarena environment "
            "plays single-player games only"
        ) from exc
    pid, obs = env.get_observation()
    return env, int(pid), list(obs)


def render(items: Sequence[Any], pid: int) -> str:
    """The text of TextArena observation items ``(sender, message, type)``, the player's own
    actions left out (the model's turn already holds them)."""
    return "\n".join(str(msg) for sender, msg, *_ in items if sender != pid).strip()


class TextArenaEnv:
    """One TextArena game (see :class:`rlzoo.tasks.textarena.TextArenaEnvParams`)."""

    def __init__(self, params: Any) -> None:
        self.params = params
        self.env: Any = None
        self.pid = 0

    def tools(self) -> Sequence[Tool]:
        return []

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        extra = row.get("extra_info") or {}
        env_id = self.params.env_id or extra.get("env_id")
        if not env_id or "seed" not in extra:
            raise TextArenaError(
                "the textarena environment plays the row's extra_info env_id at its seed (written by the "
                f"textarena dataset); this row's extra_info has {sorted(extra)}"
            )
        self.env, self.pid, obs = start(str(env_id), int(extra["seed"]))
        return EnvStep(messages=[{"role": "user", "content": render(obs, self.pid)}], reward=0.0)

    def step(self, turn: AgentTurn) -> EnvStep:
        done, _ = self.env.step(turn.text)
        if not done:
            _, obs = self.env.get_observation()
            text = render(obs, self.pid) or "(the game says nothing; your move)"
            return EnvStep(messages=[{"role": "user", "content": text}], reward=0.0)
        rewards, game_info = self.env.close()
        reward = float(rewards[self.pid])
        info = game_info.get(self.pid, {}) if isinstance(game_info, Mapping) else {}
        messages: list[Message] = []
        return EnvStep(
            messages=messages,
            reward=reward,
            done=True,
            info={"invalid_move": float(bool(info.get("invalid_move"))), "won": float(reward >= 1.0)},
        )


def make_env(params: Any) -> TextArenaEnv:
    return TextArenaEnv(params)


def rows(env_id: str, seeds: Sequence[int], split: str) -> list[dict[str, Any]]:
    out = []
    for i, seed in enumerate(seeds):
        _, pid, obs = start(env_id, seed)
        out.append(
            {
                "data_source": DATA_SOURCE_PREFIX + env_id,
                "prompt": [{"role": "user", "content": render(obs, pid)}],
                "ability": "game",
                "reward_model": {"style": "rule", "ground_truth": ""},  # the game judges
                "extra_info": {"split": split, "index": i, "env_id": env_id, "seed": int(seed)},
            }
        )
    return out


def prepare(out_dir: Path, params: Any) -> dict[str, Path]:
    def build() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        train = rows(params.env_id, range(params.seed, params.seed + params.train_size), "train")
        first_val = params.seed + VAL_SEED_OFFSET
        return train, rows(params.env_id, range(first_val, first_val + params.val_size), "val")

    return build_splits(out_dir, "textarena", params, build)


if __name__ == "__main__":  # the env ids
    print("\n".join(env_ids()))
