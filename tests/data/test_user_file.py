"""data.custom_cls / data.sampler: a dataset class and a sampler from the user's own file (verl's
contracts), checked by reading the file, imported from that path only, resumed exactly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from rlzoo.data.dataset import DataError, PromptDataset, PromptLoader
from rlzoo.data.user_file import UserDatasetSettings, UserSamplerSettings, load_class, user_rows, verl_config

DATASET_FILE = '''
import json
from torch.utils.data import Dataset

class JsonLines(Dataset):
    """verl's contract: constructed with data_files, tokenizer, processor, config."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.rows = []
        for f in data_files:
            with open(f) as fh:
                self.rows += [json.loads(line) for line in fh]
        self.suffix = config.get("suffix", "")
        self.prompt_key = config.prompt_key

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        return {
            "raw_prompt": [{"role": "user", "content": r["q"] + self.suffix}],
            "reward_model": {"style": "rule", "ground_truth": r["a"]},
            "data_source": "mine",
            "extra_info": {"i": i},
            "input_ids": [0, 1, 2],  # verl's own tokens: not read
        }
'''

SAMPLER_FILE = '''
import torch
from torch.utils.data import Sampler

class Reverse(Sampler):
    """Each epoch: a permutation from its own generator, seeded by data_config.seed."""

    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.g = torch.Generator().manual_seed(int(data_config.seed) + int(data_config.get("offset", 0)))

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.g).tolist())

    def __len__(self):
        return self.n

class Stateful(Reverse):
    def __init__(self, data_source, data_config):
        super().__init__(data_source, data_config)

    def state_dict(self):
        return {"g": self.g.get_state()}

    def load_state_dict(self, state):
        self.g.set_state(state["g"])
'''


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_dataset_class_rows_become_prompts(tmp_path: Path, tokenizer: Any) -> None:
    path = write(tmp_path, "my_data.py", DATASET_FILE)
    data = tmp_path / "rows.jsonl"
    data.write_text('{"q": "what is one plus one", "a": 2}\n{"q": "", "a": 3}\n{"q": "find x", "a": "7"}\n')
    UserDatasetSettings(path=path, name="JsonLines")  # passes the check
    cls = load_class(path, "JsonLines")
    config = verl_config({"prompt_key": "prompt", "chat_template_kwargs": {}}, {"suffix": ""})
    user = cls(data_files=[str(data)], tokenizer=tokenizer, processor=None, config=config)
    ds = PromptDataset([str(data)], tokenizer, user_dataset=user)
    assert len(ds) == 2 and ds.filter_stats.dropped == {"empty_prompt": 1}
    first = ds[0]
    assert first["messages"] == [{"role": "user", "content": "what is one plus one"}]
    assert first["ground_truth"] == "2" and first["data_source"] == "mine" and first["extra_info"] == {"i": 0}
    # the chat template renders "<|user|> what is one plus one <|assistant|>": 5 words + 2 markers
    assert first["prompt_text"] == "<|user|> what is one plus one <|assistant|>"
    assert len(first["prompt_ids"]) == 7
    assert ds[1]["ground_truth"] == "7"
    # imported once, under a private name, never as "my_data"
    assert load_class(path, "JsonLines") is cls and "my_data" not in sys.modules


def test_user_rows_read_verl_and_rlzoo_layouts() -> None:
    rows = user_rows(
        [
            {"prompt": [{"role": "user", "content": "a"}], "ground_truth": "1"},
            {"question": "b", "reward_model": {"ground_truth": "2"}, "extra_info": "not a dict"},
        ],
        "question",
    )
    assert rows[0]["question"] is None and rows[0]["ground_truth"] == "1"  # the prompt_key column is read
    assert rows[1]["question"] == "b" and rows[1]["ground_truth"] == "2" and rows[1]["extra_info"] is None
    with pytest.raises(TypeError, match="each row must be a dict"):
        user_rows(["x"], "prompt")


@pytest.mark.parametrize(
    ("text", "name", "match"),
    [
        ("class A:\n    pass\n", "B", r"defines no top-level class 'B' \(its classes: \['A'\]\)"),
        ("class A:\n    pass\n", "A", "has no __init__ and no base class"),
        (
            "class A:\n    def __init__(self, data_files, tokenizer):\n        pass\n",
            "A",
            r"does not accept the keyword\(s\) \['processor', 'config'\]",
        ),
        (
            "class A:\n    def __init__(self, data_files, tokenizer, processor, config, split):\n        pass\n",
            "A",
            r"requires \['split'\]",
        ),
        ("def f(:\n", "A", "is not Python that parses"),
    ],
)
def test_dataset_class_checks_name_what_is_wrong(tmp_path: Path, text: str, name: str, match: str) -> None:
    path = write(tmp_path, "d.py", text + "\nraise SystemExit('the check must not run the file')\n")
    with pytest.raises(ValueError, match=match):
        UserDatasetSettings(path=path, name=name)


def test_dataset_class_check_accepts_kwargs_and_inherited_init(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "d.py",
        "import os\nclass A(dict):\n    pass\nclass B:\n    def __init__(self, **kw):\n        pass\n"
        "raise SystemExit('not run')\n",
    )
    UserDatasetSettings(path=path, name="A")
    UserDatasetSettings(path=path, name="B")
    with pytest.raises(ValueError, match="does not exist"):
        UserDatasetSettings(path=str(tmp_path / "nope.py"), name="A")


def test_sampler_check_refuses_a_curriculum_sampler_and_bad_args(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "s.py",
        "class C:\n    def __init__(self, data_source, data_config):\n        pass\n"
        "    def update(self, batch):\n        pass\n"
        "class D:\n    def __init__(self, dataset):\n        pass\n",
    )
    with pytest.raises(ValueError, match="is a curriculum sampler"):
        UserSamplerSettings(path=path, name="C")
    with pytest.raises(
        ValueError, match=r"does not accept the keyword\(s\) \['data_source', 'data_config'\]"
    ):
        UserSamplerSettings(path=path, name="D")


def make_sampler(tmp_path: Path, name: str, n: int, seed: int = 3) -> Any:
    path = write(tmp_path, "my_sampler.py", SAMPLER_FILE)
    UserSamplerSettings(path=path, name=name)
    return load_class(path, name)(data_source=list(range(n)), data_config=verl_config({"seed": seed}, {}))


def expected_orders(n: int, seed: int, epochs: int) -> list[list[int]]:
    """Hand-written: the generator seeded once, one randperm per epoch."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=g).tolist() for _ in range(epochs)]


def test_the_sampler_gives_each_epochs_order(tmp_path: Path) -> None:
    items = list(range(10))
    loader = PromptLoader(items, 4, sampler=make_sampler(tmp_path, "Reverse", 10))
    seen = [next(loader) for _ in range(6)]  # drop_last: 2 batches per epoch
    want = expected_orders(10, 3, 3)
    assert seen == [o[k : k + 4] for o in want for k in (0, 4)]


@pytest.mark.parametrize("name", ["Reverse", "Stateful"])
@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_a_resumed_loader_with_a_sampler_continues_exactly(
    tmp_path: Path, name: str, stop_after: int
) -> None:
    import json

    items = list(range(10))
    full = PromptLoader(items, 4, sampler=make_sampler(tmp_path, name, 10))
    want = [next(full) for _ in range(8)]
    first = PromptLoader(items, 4, sampler=make_sampler(tmp_path, name, 10))
    got = [next(first) for _ in range(stop_after)]
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints are JSON
    resumed = PromptLoader(items, 4, sampler=make_sampler(tmp_path, name, 10))
    resumed.load_state_dict(state)
    got += [next(resumed) for _ in range(8 - stop_after)]
    assert got == want


def test_a_sampler_giving_bad_indices_is_refused(tmp_path: Path) -> None:
    class Bad:
        def __iter__(self):
            return iter([0, 1, 12, 3])

    with pytest.raises(DataError, match=r"indices outside 0..9 \(e.g. \[12\]\)"):
        next(PromptLoader(list(range(10)), 2, sampler=Bad()))
    with pytest.raises(DataError, match="taken without a sampler"):
        PromptLoader(list(range(10)), 2, sampler=Bad()).load_state_dict(
            PromptLoader(list(range(10)), 2).state_dict()
        )
