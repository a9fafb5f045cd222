"""Multi-turn rollouts on the native engine: token exactness as tested invariants.

(a) the ids trained at loss-mask-1 positions are exactly the ids the engine sampled, turn by turn;
(b) the train backend's recomputed log-probs there equal the engine's (fp32, <= 1e-5) over >= 3
turns. Here on the tool task's word-level tokenizer; ``test_exactness_bpe.py`` runs the same checks
with SmolLM2's BPE tokenizer and shows them failing on a build that re-tokenizes.
"""

from __future__ import annotations

from typing import Any

import pytest

import rlzoo
from agents.helpers import Chatter, Recorder, check_sampled_ids_are_trained, requests
from rlzoo.agents.rollout import MultiTurnRollout
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.inputs import load_tokenizer, rollout_spec, train_spec


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = tmp_path_factory.mktemp("tools")
    run = rlzoo.build_run("quickstart_tools", [f"data.dir={data_dir}", "data.max_response_length=160"])
    cfg = run.config
    from rlzoo.train.inputs import ensure_data

    ensure_data(cfg)
    tok = load_tokenizer(cfg)
    spec = rollout_spec(cfg, tok)
    return {
        "cfg": cfg,
        "tok": tok,
        "spec": spec,
        "trainer": cfg.trainer.backend.fn(cfg.trainer.backend.params, train_spec(cfg, 1, tok)),
    }


def _rollout(parts: dict[str, Any], *, turns: int = 3) -> tuple[MultiTurnRollout, Recorder]:
    from rlzoo.tasks._tools import CalcTool
    from rlzoo.tasks.tools import CalcParams

    cfg, tok, spec = parts["cfg"], parts["tok"], parts["spec"]
    inner = Recorder(cfg.rollout.backend.fn(cfg.rollout.backend.params, spec))
    calc = CalcTool(CalcParams(spaced_digits=True))
    settings = MultiTurnSettings(
        max_turns=6, max_tool_calls=3, per_turn_max_tokens=40, tool_call_format="plain"
    )
    mt = MultiTurnRollout(
        inner,  # type: ignore[arg-type]
        lambda: Chatter(turns, [calc]),
        tok,
        settings,
        max_response_length=spec.max_response_length,
        stop_ids=spec.eos_token_ids,
    )
    return mt, inner


def test_trained_ids_are_the_sampled_ids(parts: dict[str, Any]) -> None:
    mt, rec = _rollout(parts)
    samples = mt.generate(requests())
    batch = samples_to_batch(samples, None, int(parts["tok"].pad_token_id))
    assert check_sampled_ids_are_trained(samples, rec, batch) >= 3
    # observations are in the context (attention 1) but never trained (mask 0)
    env_tokens = sum(s.agent["env_tokens"] for s in samples)  # type: ignore[index]
    assert env_tokens > 0
    assert int(batch["response_mask"].sum()) == sum(s.agent["model_tokens"] for s in samples)  # type: ignore[index]


def test_trainer_log_probs_equal_the_engine_s_over_three_turns(parts: dict[str, Any]) -> None:
    mt, _ = _rollout(parts)
    samples = mt.generate(requests())
    assert max(s.agent["turns"] for s in samples) >= 3  # type: ignore[index]
    batch = samples_to_batch(samples, None, int(parts["tok"].pad_token_id))
    lp, _ = parts["trainer"].compute_log_probs(batch)  # [B, T] fp32
    mask = batch["response_mask"].bool()  # [B, T]
    diff = (lp - batch["rollout_log_probs"]).abs()[mask]
    assert diff.numel() > 50 and float(diff.max()) <= 1e-5, float(diff.max())


def test_the_rollout_is_a_rollout_backend_and_forwards_nothing_else(parts: dict[str, Any]) -> None:
    """Composed, not impersonating: the Protocol's members are its own; anything else of the engine
    (``abort``, ``model``, a sync report) is asked of the engine, which the caller holds."""
    from rlzoo.kernel.protocols import RolloutBackend

    mt, rec = _rollout(parts)
    try:
        assert isinstance(mt, RolloutBackend)
        assert "__getattr__" not in vars(MultiTurnRollout)
        assert callable(getattr(rec, "abort", None))  # the engine has it ...
        assert not hasattr(mt, "abort")  # ... the multi-turn rollout does not pass it on
        assert mt.version == rec.version
    finally:
        mt.shutdown()
