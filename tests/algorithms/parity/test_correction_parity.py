"""Rollout corrections against verl 0.9.1's ``rollout_corr_helper``: weights, mask, metrics.

Every metric verl reports must exist under the same name (``rollout_corr/...``) with the same
value; rlzoo adds a few of its own (``masked_fraction``, ``rollout_probs_diff_*``). The batches have
no empty response (verl averages those in as zeros, rlzoo skips them: a documented difference).
"""

from __future__ import annotations

import pytest

import rlzoo
from rlzoo.kernel.protocols import CorrectionInputs

from ._verl import RECORD, make_batch, rollout_corr

#: (rlzoo part, rlzoo params, verl keyword arguments)
CASES = [
    ("token_is", {"threshold": 2.0}, {"rollout_is": "token", "rollout_is_threshold": 2.0}),
    ("token_is", {"threshold": 1.2}, {"rollout_is": "token", "rollout_is_threshold": 1.2}),
    (
        "token_is",
        {"threshold": 1.5, "batch_normalize": True},
        {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_is_batch_normalize": True},
    ),
    ("seq_is", {"threshold": 2.0}, {"rollout_is": "sequence", "rollout_is_threshold": 2.0}),
    (
        "seq_is",
        {"threshold": 3.0, "batch_normalize": True},
        {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True},
    ),
    ("icepop", {"low": 0.8, "high": 1.25}, {"rollout_is": "token", "rollout_is_threshold": "0.8_1.25"}),
    ("icepop", {"low": 0.5, "high": 5.0}, {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}),
]
for crit, thr in [
    ("token_k1", "0.8_2.0"),
    ("token_k1", "1.3"),
    ("token_k2", "0.02"),
    ("token_k3", "0.02"),
    ("seq_sum_k1", "0.5_2.0"),
    ("seq_sum_k2", "0.1"),
    ("seq_sum_k3", "0.1"),
    ("seq_mean_k1", "0.9_1.2"),
    ("seq_mean_k2", "0.02"),
    ("seq_mean_k3", "0.02"),
    ("seq_max_k2", "0.05"),
    ("seq_max_k3", "0.05"),
    ("token_k1,seq_mean_k3", "0.8_2.0,0.02"),
    ("seq_sum_k2,token_k3,seq_max_k2", "0.2"),
]:
    CASES.append(
        (
            "rejection",
            {"criteria": crit, "thresholds": thr},
            {"rollout_rs": crit, "rollout_rs_threshold": thr},
        )
    )
CASES.append(
    (
        "rejection",
        {"criteria": "seq_mean_k3", "thresholds": "0.02", "is_level": "sequence", "is_threshold": 2.0},
        {
            "rollout_rs": "seq_mean_k3",
            "rollout_rs_threshold": "0.02",
            "rollout_is": "sequence",
            "rollout_is_threshold": 2.0,
        },
    )
)


@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize(
    ("name", "params", "verl_kw"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_correction_matches_verl(name, params, verl_kw, seed):
    b = make_batch(seed)
    comp = rlzoo.get_plugin_manager().registry("rollout_correction").get(name)
    out = comp.load()(CorrectionInputs(b.old_log_probs, b.rollout_log_probs, b.mask), comp.params(**params))
    proto, mask, metrics = rollout_corr.compute_rollout_correction_and_rejection_mask(
        b.old_log_probs, b.rollout_log_probs, b.mask, **verl_kw
    )
    part = f"{name} {params.get('criteria', '')}".strip()
    RECORD.close(part, "response mask", out.mask, mask)
    kept = out.mask.bool()
    if proto is not None:
        theirs = proto.batch["rollout_is_weights"]
        # rlzoo also zeroes the weights of rejected tokens (verl drops them through the mask)
        RECORD.close(part, "IS weights (kept tokens)", out.weights[kept], theirs[kept])
    else:
        assert out.weights is None
    missing = sorted(set(metrics) - set(out.metrics))
    assert not missing, f"verl metrics rlzoo does not report: {missing}"
    for key, value in metrics.items():
        RECORD.close(
            part, f"metric {key.removeprefix('rollout_corr/')}", out.metrics[key], value, atol=1e-7, rtol=1e-6
        )


def test_token_veto_has_no_verl_091_counterpart():
    """verl 0.9.1 dropped rollout_token_veto_threshold (it existed in 0.5-0.6): documented, not compared."""
    import inspect

    src = inspect.signature(rollout_corr.compute_rollout_correction_and_rejection_mask)
    assert "rollout_token_veto_threshold" not in src.parameters


def test_empty_response_is_a_documented_difference():
    """verl averages an empty response into per-sequence metrics as a zero; rlzoo leaves it out."""
    b = make_batch(4)
    b.mask[2] = 0.0
    comp = rlzoo.get_plugin_manager().registry("rollout_correction").get("token_is")
    out = comp.load()(CorrectionInputs(b.old_log_probs, b.rollout_log_probs, b.mask), comp.params())
    _, mask, metrics = rollout_corr.compute_rollout_correction_and_rejection_mask(
        b.old_log_probs, b.rollout_log_probs, b.mask, rollout_is="token", rollout_is_threshold=2.0
    )
    assert (out.mask == mask).all()
    key = "rollout_corr/training_ppl"  # verl: the empty row adds exp(-0) = 1 to the mean
    B = b.mask.shape[0]
    valid_mean = float(out.metrics[key])
    assert abs(metrics[key] - (valid_mean * (B - 1) + 1.0) / B) < 1e-6
    assert abs(metrics[key] - valid_mean) > 1e-6
