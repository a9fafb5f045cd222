"""The batch metrics of docs/metrics.md, each checked against its definition on a hand-built batch.

Every expected number is worked out by hand in a comment from the samples below, never taken from
the code under test. Policy-loss metrics (``actor/pg_clipfrac`` ...) are checked against verl's
formulas in tests/algorithms/test_policy_loss.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlzoo.kernel.protocols import RewardResult, Sample
from rlzoo.train.batching import clip_ratio, rollout_metrics, samples_to_batch
from rlzoo.train.rewards import validation_metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
MAX_LEN = 4
EOS = 9


def sample(rid: str, i: int, prompt: list[int], resp: list[int], reason: str, versions=None) -> Sample:
    return Sample(
        request_id=rid,
        index=i,
        prompt_ids=prompt,
        response_ids=resp,
        rollout_log_probs=[-0.5] * len(resp),
        versions=versions if versions is not None else [3] * len(resp),
        finish_reason=reason,
        data={"data_source": "toy"},
    )


def hand_batch():
    samples = [
        # 4 tokens, ends with EOS exactly at the limit: complete, NOT clipped
        sample("a", 0, [1, 2], [5, 6, 7, EOS], "stop"),
        # 4 tokens, no EOS: cut off by the limit, clipped
        sample("a", 1, [1, 2], [5, 6, 7, 8], "length", versions=[3, 3, 4, 4]),
        # 2 tokens ending with EOS
        sample("b", 0, [3, 4, 5], [6, EOS], "stop"),
        # 1 token, aborted well before the limit: not clipped
        sample("b", 1, [3, 4, 5], [6], "abort"),
    ]
    results = [
        RewardResult(reward=1.0, score=1.0, info={"acc": 1.0}),
        RewardResult(reward=-0.5, score=0.0, info={"acc": 0.0}),
        RewardResult(reward=0.5, score=1.0, info={"acc": 1.0}),
        RewardResult(reward=0.0, score=0.0, failed=True, info={"acc": 0.0}),
    ]
    return samples, results, samples_to_batch(samples, results, pad_token_id=0, max_response_length=MAX_LEN)


def test_clip_ratio_counts_only_responses_cut_without_eos() -> None:
    """Failed before the fix: a response ending in EOS exactly at the limit was counted clipped
    (the quickstart reported clip ratio 1.0 with every response ending in EOS)."""
    _, _, batch = hand_batch()
    m = rollout_metrics(batch, MAX_LEN)
    # lengths 4, 4, 2, 1; at the limit: samples 0 and 1; of those only sample 1 lacks EOS -> 1/4
    assert m["response_length/clip_ratio"] == pytest.approx(0.25)
    # every response at the limit but each ended with EOS -> nothing clipped
    samples = [sample("q", i, [1], [5, 6, 7, EOS], "stop") for i in range(3)]
    b = samples_to_batch(samples, None, pad_token_id=0, max_response_length=MAX_LEN)
    b["token_level_scores"] = b["rollout_log_probs"] * 0
    assert rollout_metrics(b, MAX_LEN)["response_length/clip_ratio"] == 0.0


def test_clip_ratio_function() -> None:
    import torch

    lens = torch.tensor([4.0, 4.0, 3.0, 4.0])
    assert clip_ratio(lens, ["stop", "length", "length", "abort"], 4) == pytest.approx(0.5)  # 2nd, 4th
    assert clip_ratio(lens, None, 4) == pytest.approx(0.75)  # no finish reasons: length alone


def test_rollout_metrics_match_their_definitions() -> None:
    _, _, batch = hand_batch()
    m = rollout_metrics(batch, MAX_LEN)
    # sequence score = reward on the last response token: 1.0, -0.5, 0.5, 0.0
    assert m["critic/score/mean"] == pytest.approx((1.0 - 0.5 + 0.5 + 0.0) / 4)  # 0.25
    assert m["critic/score/max"] == pytest.approx(1.0)
    assert m["critic/score/min"] == pytest.approx(-0.5)
    # the scorers' verdict (info["acc"]) without shaping: 1, 0, 1, 0
    assert m["critic/acc/mean"] == pytest.approx(0.5)
    assert m["response_length/mean"] == pytest.approx((4 + 4 + 2 + 1) / 4)  # 2.75
    assert m["response_length/max"] == 4.0
    assert m["response_length/min"] == 1.0
    assert m["prompt_length/mean"] == pytest.approx((2 + 2 + 3 + 3) / 4)  # 2.5
    assert m["reward/failed"] == 1.0  # sample 3's scorer failed
    assert "rollout/partial_ratio" not in m  # one place: the loop's version_metrics


def test_version_metrics_match_their_definitions() -> None:
    from rlzoo.train.loop import VersionMap, version_metrics

    vm = VersionMap(10, 0)  # backend version 10 is policy version 0
    vm.push(12)  # policy 1
    vm.push(15)  # policy 2 (current)
    # tokens' backend versions per sample: fresh; from policies 0 and 1 (a partial rollout); policy 1;
    # empty
    m = version_metrics([[15, 15], [10, 12, 12], [13], []], vm)
    # staleness = 2 - policy of the oldest token: 0, 2, 1, 0
    assert m["staleness/mean"] == pytest.approx((0 + 2 + 1 + 0) / 4)
    assert m["staleness/max"] == 2.0 and m["staleness/min"] == 0.0
    assert m["staleness/stale_ratio"] == pytest.approx(2 / 4)
    # spans in policy versions: 0, 1 (policies 0..1), 0, 0
    assert m["rollout/partial_ratio"] == pytest.approx(1 / 4)
    assert m["rollout/version_span/mean"] == pytest.approx(1 / 4)
    assert m["rollout/version_span/max"] == 1.0


def test_validation_metrics_match_their_definitions() -> None:
    def vs(rid: str, i: int, source: str, n_tokens: int) -> Sample:
        s = sample(rid, i, [1], [5] * n_tokens, "stop")
        s.data["data_source"] = source
        return s

    samples = [vs("p", 0, "gsm", 2), vs("p", 1, "gsm", 4), vs("p", 2, "gsm", 6), vs("q", 0, "aime", 3)]
    samples += [vs("q", 1, "aime", 3), vs("q", 2, "aime", 3)]
    results = [
        RewardResult(1.0, 1.0, info={"acc": 1.0, "pred": "7"}),
        RewardResult(0.0, 0.0, info={"acc": 0.0, "pred": "8"}),
        RewardResult(1.0, 1.0, info={"acc": 1.0, "pred": "7"}),
        RewardResult(0.0, 0.0, info={"acc": 0.0, "pred": "1"}),
        RewardResult(0.0, 0.0, info={"acc": 0.0, "pred": "1"}),
        RewardResult(1.0, 1.0, info={"acc": 1.0, "pred": "2"}),
    ]
    m = validation_metrics(samples, results, 3)
    # prompt p (gsm): accs 1, 0, 1 -> mean@3 = 2/3, best@3 = 1, majority answer "7" is right -> maj@3 = 1
    assert m["val/gsm/mean@3"] == pytest.approx(2 / 3)
    assert m["val/gsm/best@3"] == 1.0
    assert m["val/gsm/maj@3"] == 1.0
    # prompt q (aime): accs 0, 0, 1 -> mean@3 = 1/3, best@3 = 1, majority answer "1" is wrong -> 0
    assert m["val/aime/mean@3"] == pytest.approx(1 / 3)
    assert m["val/aime/best@3"] == 1.0
    assert m["val/aime/maj@3"] == 0.0
    # val/mean: mean over prompts of mean@n = (2/3 + 1/3) / 2
    assert m["val/mean"] == pytest.approx(0.5)
    assert m["val/response_length/mean"] == pytest.approx((2 + 4 + 6 + 3 + 3 + 3) / 6)


def documented_metrics() -> list[str]:
    """Every metric name in docs/metrics.md's table, with `/a` `/b` suffix groups expanded."""
    names: list[str] = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        base = None
        for tok in re.findall(r"`([^`]+)`", cell):
            if tok.startswith("/") and base is not None:
                names.append(base.rsplit("/", 1)[0] + tok)
            else:
                base = tok
                names.append(tok)
    return names


def test_every_rollout_metric_is_documented() -> None:
    _, _, batch = hand_batch()
    documented = set(documented_metrics())
    assert "response_length/clip_ratio" in documented
    missing = [k for k in rollout_metrics(batch, MAX_LEN) if k not in documented]
    assert not missing, f"metrics not in docs/metrics.md: {missing}"
