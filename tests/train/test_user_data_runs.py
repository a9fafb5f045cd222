"""data.custom_cls and data.sampler end to end on the quickstart task (native backends): a run reads its
prompts through the user's dataset class, in the user's sampler's order, and a resumed run continues
exactly; trainer.lora.adapter_path continues from a run's adapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from run_fixtures import build

from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.metrics import read_metrics

DATASET = """
import json
import pyarrow.parquet as pq

class ParquetRows:
    def __init__(self, data_files, tokenizer, processor, config):
        self.rows = [r for f in data_files for r in pq.read_table(f).to_pylist()][: config.keep]
        with open(config.log, "a") as fh:
            fh.write(json.dumps({"files": list(data_files), "prompt_key": config.prompt_key}) + "\\n")

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        return {"raw_prompt": r["prompt"], "reward_model": r["reward_model"], "data_source": r["data_source"]}
"""

SAMPLER = '''
import json
import random

class Shuffled:
    """Each epoch a permutation from its own random.Random(seed); logs what it gave."""

    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.rng = random.Random(int(data_config.seed) * 7)
        self.log = data_config.log

    def __iter__(self):
        order = self.rng.sample(range(self.n), self.n)
        with open(self.log, "a") as fh:
            fh.write(json.dumps(order) + "\\n")
        return iter(order)
'''

KEYS = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm")


def user_files(tmp_path: Path) -> list[str]:
    (tmp_path / "my_data.py").write_text(DATASET)
    (tmp_path / "my_sampler.py").write_text(SAMPLER)
    return [
        f"data.custom_cls.path={tmp_path / 'my_data.py'}",
        "data.custom_cls.name=ParquetRows",
        f"data.custom_cls.config={{keep: 40, log: {tmp_path / 'dataset.log'}}}",
        f"data.sampler.path={tmp_path / 'my_sampler.py'}",
        "data.sampler.name=Shuffled",
        f"data.sampler.config={{log: {tmp_path / 'sampler.log'}}}",
    ]


def test_a_run_reads_the_users_dataset_in_the_samplers_order_and_resumes_exactly(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    common = [*user_files(tmp_path), "data.train_batch_size=16", "trainer.total_steps=4"]
    build(pm, "quickstart", quickstart_dir, a_dir, *common, "trainer.save_freq=2").train()
    full = {r["step"]: r for r in read_metrics(a_dir)}
    built = [json.loads(line) for line in (tmp_path / "dataset.log").read_text().splitlines()]
    assert built[0] == {"files": [str(quickstart_dir / "train.parquet")], "prompt_key": "prompt"}
    orders = [json.loads(line) for line in (tmp_path / "sampler.log").read_text().splitlines()]
    # 40 prompts (config.keep), 16 a step: 2 steps an epoch, so 4 steps draw 2 epochs of 40 indices
    assert len(orders) == 2 and all(sorted(o) == list(range(40)) for o in orders)

    shutil.copytree(a_dir / "checkpoints" / "step_2", b_dir / "checkpoints" / "step_2")
    (b_dir / "checkpoints" / "latest").write_text("step_2")
    shutil.copy(a_dir / "config.yaml", b_dir / "config.yaml")
    build(pm, "quickstart", quickstart_dir, b_dir, *common, "resume=true").train()
    resumed = {r["step"]: r for r in read_metrics(b_dir)}
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for k in KEYS:
            assert resumed[step][k] == pytest.approx(full[step][k], rel=1e-5, abs=1e-7), (step, k)


def test_a_run_continues_from_a_saved_lora_adapter(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("peft")
    lora = [
        "trainer.lora.rank=4",
        "trainer.lora.alpha=8",
        "trainer.optim.lr=1e-2",
        "algorithm.use_kl_loss=true",
    ]
    a_dir, b_dir, c_dir = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    build(pm, "quickstart", quickstart_dir, a_dir, *lora, "trainer.total_steps=2").train()
    adapter = a_dir / "final" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    build(
        pm,
        "quickstart",
        quickstart_dir,
        b_dir,
        *lora,
        "trainer.total_steps=1",
        "trainer.ppo_mini_batch_size=16",
    ).train()
    build(
        pm, "quickstart", quickstart_dir, c_dir, *lora, "trainer.total_steps=1", "trainer.ppo_mini_batch_size=16",
        f"trainer.lora.adapter_path={adapter}",
    ).train()  # fmt: skip
    fresh, cont = read_metrics(b_dir)[0], read_metrics(c_dir)[0]
    # fresh adapters (B = 0) start at the reference: no KL; the continued ones start where run a ended
    assert fresh["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert cont["actor/kl_loss"] > 1e-6
