"""The ``reward_model`` reward manager on a tiny sequence-classification model built from a config
(CPU, offline). Expected scores come from transformers' own forward of each text alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import RewardItem
from rlzoo.testing import RewardManagerConformance

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def build_tiny_rm(out: Path, num_labels: int = 1) -> Path:
    from rlzoo.models.tiny import build_tokenizer, tiny_qwen2_config

    tok = build_tokenizer()
    cfg = tiny_qwen2_config(len(tok), num_labels=num_labels, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_rm(tmp_path_factory.mktemp("tiny_rm"))


def manager(path: Path, scorer: Any = None, **params: Any) -> Any:
    from rlzoo.kernel.plugins import get_plugin_manager
    from rlzoo.recipe.config import bind_part

    problems: list[str] = []
    raw = {"name": "reward_model", "path": str(path), **params}
    sel = bind_part("reward_manager", raw, "t", problems, get_plugin_manager())
    assert not problems, problems
    assert sel is not None
    return sel.fn(sel.params, scorer or (lambda *a: 1.0))


def reference_score(path: Path, text: str) -> float:
    """transformers' own pooled score of ``text`` alone (no padding)."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    ids = torch.tensor([tok(text)["input_ids"]])
    assert ids[0, -1].item() != tok.pad_token_id  # HF pools the last non-pad token: the last one here
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


ITEMS = [
    RewardItem(
        response=" the answer is 42", ground_truth="42", prompt="<|user|> what is 6 x 7 <|assistant|>"
    ),
    RewardItem(response=" no", ground_truth="7", prompt="<|user|> hi <|assistant|>"),
    RewardItem(response="", ground_truth="1", prompt="<|user|> a much longer prompt with many words here"),
]


def test_batched_scores_equal_each_text_alone(rm_path):
    mgr = manager(rm_path, batch_size=2)  # a batch of 2 (different lengths: left padding) and one of 1
    results = mgr(ITEMS)
    expected = [reference_score(rm_path, it.prompt + it.response) for it in ITEMS]
    assert [r.reward for r in results] == pytest.approx(expected, abs=1e-5)
    assert [r.score for r in results] == pytest.approx(expected, abs=1e-5)
    assert [r.info["rm_score"] for r in results] == pytest.approx(expected, abs=1e-5)
    assert len({round(e, 6) for e in expected}) == 3  # the texts score differently


def test_with_scorer_metric_and_add(rm_path):
    rm = [r.reward for r in manager(rm_path)(ITEMS)]

    def exact(response, ground_truth, data_source, extra_info):
        return 1.0 if str(ground_truth) in response else 0.0

    metric = manager(rm_path, exact, with_scorer="metric")(ITEMS)
    assert [r.score for r in metric] == [1.0, 0.0, 0.0]
    assert [r.reward for r in metric] == pytest.approx(rm)
    added = manager(rm_path, exact, with_scorer="add")(ITEMS)
    assert [r.reward for r in added] == pytest.approx([rm[0] + 1.0, rm[1], rm[2]])


def test_response_suffix_and_max_length(rm_path):
    suffixed = manager(rm_path, response_suffix="<eos>")(ITEMS[:1])[0].reward
    assert suffixed == pytest.approx(
        reference_score(rm_path, ITEMS[0].prompt + ITEMS[0].response + "<eos>"), abs=1e-5
    )
    tok = transformers.AutoTokenizer.from_pretrained(rm_path)
    ids = tok(ITEMS[2].prompt)["input_ids"]
    cut = manager(rm_path, max_length=4)(ITEMS[2:])[0].reward
    model = transformers.AutoModelForSequenceClassification.from_pretrained(rm_path).eval()
    with torch.no_grad():
        expected = float(model(input_ids=torch.tensor([ids[-4:]])).logits[0, 0])
    assert cut == pytest.approx(expected, abs=1e-5)


def test_a_classifier_with_several_labels_is_refused(tmp_path):
    path = build_tiny_rm(tmp_path / "two", num_labels=2)
    with pytest.raises(RlzooError, match=r"one output \(num_labels=1\), this one has 2"):
        manager(path)(ITEMS)


class TestRewardModelConformance(RewardManagerConformance):
    """The reward manager suite: with_scorer=metric makes ``score`` the scorer's verdict."""

    name = "reward_model"
    _path: ClassVar[Path | None] = None

    @property
    def params_overrides(self) -> dict[str, Any]:  # type: ignore[override]
        if TestRewardModelConformance._path is None:
            import tempfile

            TestRewardModelConformance._path = build_tiny_rm(Path(tempfile.mkdtemp(prefix="rlzoo_tiny_rm_")))
        return {"path": str(TestRewardModelConformance._path), "with_scorer": "metric"}
