"""runner sft end to end on quickstart_tools' tiny model: the first step's loss is the mean NLL of the
demonstrations' assistant tokens computed independently (transformers' causal-LM loss over the rendered
ids), and the same on every train backend / setting (native, packed, LoRA, fsdp2 over gloo); the
rules validate enforces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rlzoo
from rlzoo.kernel.errors import ConfigError
from rlzoo.report.metrics import read_metrics

STEPS = 2
BATCH = 8
BASE = [
    "run.progress=false",
    "run.loggers=[jsonl]",
    f"trainer.total_steps={STEPS}",
    "trainer.save_freq=-1",
    "trainer.val_before_train=false",
    "rollout.n=1",
    "algorithm.policy_loss=nll",
    "algorithm.entropy_coeff=0.0",
    f"data.train_batch_size={BATCH}",
    "trainer.ppo_mini_batch_size=null",
    "data.shuffle=false",
]
SETTINGS = {
    "native": [],
    "packed": ["trainer.backend.use_remove_padding=true"],
    "lora": ["trainer.lora.rank=4", "trainer.lora.alpha=8"],
    "fsdp2": ["trainer.backend=fsdp2"],
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quickstart_tools")


def sft(data_dir: Path, out: Path, *extra: str) -> list[dict]:
    demos = data_dir / "demos.parquet"
    runner = f"runner={{name: sft, files: [{demos}], generate: {0 if demos.exists() else 32}}}"
    run = rlzoo.build_run(
        "quickstart_tools", [f"data.dir={data_dir}", f"run.output_dir={out}", *BASE, runner, *extra]
    )
    run.train()
    return [r for r in read_metrics(out) if r["step"] > 0]


def independent_nll(data_dir: Path) -> float:
    """Mean NLL over the assistant tokens of the first BATCH demonstrations (data.shuffle=false), from the
    initial model with transformers' ForCausalLMLoss (TRL's SFT loss): labels -100 off the mask."""
    from transformers import AutoModelForCausalLM
    from transformers.loss.loss_utils import ForCausalLMLoss

    from rlzoo.agents.chat import ChatTemplate
    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.sources.demos import read_conversations, render

    tok = load_tokenizer(str(data_dir / "model"))
    template = ChatTemplate(tok, stop_ids=[tok.eos_token_id])
    model = AutoModelForCausalLM.from_pretrained(str(data_dir / "model"), torch_dtype=torch.float32)
    convs = read_conversations(
        [data_dir / "demos.parquet"], messages_key="messages", prompt_key="prompt", response_key="response"
    )
    ids, labels = [], []
    for messages, _ in convs[:BATCH]:
        prompt, response, mask = render(template, messages)
        ids.append(prompt + response)
        labels.append([-100] * len(prompt) + [t if m else -100 for t, m in zip(response, mask)])
    width = max(len(x) for x in ids)
    x = torch.tensor([r + [0] * (width - len(r)) for r in ids])
    y = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=attn).logits
    return float(ForCausalLMLoss(logits, y, vocab_size=logits.shape[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_first_step_loss_is_the_demonstrations_nll(setting: str, data_dir: Path, tmp_path: Path) -> None:
    rows = sft(data_dir, tmp_path, *SETTINGS[setting])
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["sft/trained_tokens"] == BATCH * 23  # "calc a + b <eos>" 9 + "Answer: <line> <eos>" 14
    # token-mean NLL before the first update (LoRA starts as the base model: B = 0)
    assert rows[0]["actor/pg_loss"] == pytest.approx(independent_nll(data_dir), rel=1e-4)
    assert rows[1]["actor/pg_loss"] < rows[0]["actor/pg_loss"]  # the next batch is learned from the first
    assert (tmp_path / "final" / "config.json").is_file()  # exported


def test_validate_refuses_what_cannot_train_demonstrations(data_dir: Path, tmp_path: Path) -> None:
    demos = tmp_path / "none.parquet"
    with pytest.raises(ConfigError) as err:
        rlzoo.build_run(
            "quickstart_tools",
            [
                f"data.dir={tmp_path / 'data'}",
                f"runner={{name: sft, files: [{demos}]}}",
                "algorithm.policy_loss=ppo_clip",
            ],
        )
    text = str(err.value)
    assert "rollout.n: 8" in text and "set rollout.n=1" in text
    assert "'ppo_clip' reads advantages" in text
    with pytest.raises(ConfigError, match="sft runner needs at least one demonstrations file"):
        rlzoo.build_run("quickstart_tools", [f"data.dir={data_dir}", "runner=sft", "rollout.n=1", *BASE[6:7]])
