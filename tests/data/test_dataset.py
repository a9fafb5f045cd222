"""PromptDataset (reading, rendering, filtering) and PromptLoader (order, epochs, resume)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from rlzoo.data.dataset import DataError, PromptDataset, PromptLoader
from rlzoo.data.schema import SchemaError

from .conftest import chat_row, make_tokenizer, png_bytes, write_rows

# With the test tokenizer a prompt of W words renders as "<|user|> w1 .. wW <|assistant|>": W + 2 tokens.


def five_rows() -> list[dict[str, Any]]:
    return [
        chat_row("what is one plus one", "2"),  # 5 words -> 7 tokens
        chat_row("solve for x", "3"),  # 3 words -> 5 tokens
        chat_row("what is one plus one plus one", "3"),  # 7 words -> 9 tokens
        chat_row("find x", "4"),  # 2 words -> 4 tokens
        chat_row("two plus x equals five", "3"),  # 5 words -> 7 tokens
    ]


# ---------------------------------------------------------------------------------------------
# reading and rendering
# ---------------------------------------------------------------------------------------------
def test_items(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(tmp_path / "train.parquet", five_rows())
    ds = PromptDataset([str(f)], tokenizer, max_prompt_length=16)
    assert len(ds) == 5
    item = ds[0]
    assert item["prompt_text"] == "<|user|> what is one plus one <|assistant|>"
    assert item["prompt_ids"] == tokenizer("<|user|> what is one plus one <|assistant|>")["input_ids"]
    assert len(item["prompt_ids"]) == 7
    assert item["ground_truth"] == "2"
    assert item["data_source"] == "openai/gsm8k"
    assert item["extra_info"] == {"split": "train", "index": 0}
    assert item["images"] is None
    assert item["messages"] == [{"role": "user", "content": "what is one plus one"}]
    assert [ds[i]["index"] for i in range(5)] == [0, 1, 2, 3, 4]
    assert ds.filter_stats.total == 5 and ds.filter_stats.kept == 5 and ds.filter_stats.dropped == {}
    # items are copies: a runner mutating one does not change the dataset
    item["prompt_ids"].append(99)
    item["extra_info"]["x"] = 1
    assert len(ds[0]["prompt_ids"]) == 7 and "x" not in ds[0]["extra_info"]


def test_several_files_and_flat_ground_truth(tmp_path: Path, tokenizer: Any) -> None:
    a = write_rows(tmp_path / "a.parquet", five_rows()[:2])
    b = write_rows(
        tmp_path / "b.parquet",
        [{"data_source": "s", "prompt": [{"role": "user", "content": "find x"}], "ground_truth": "9"}],
    )
    ds = PromptDataset([a, b], tokenizer)
    assert len(ds) == 3
    assert ds[2]["ground_truth"] == "9" and ds[2]["extra_info"] == {} and ds[2]["index"] == 2


def test_string_prompt_column(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(
        tmp_path / "q.parquet", [{"data_source": "s", "question": "solve for x", "ground_truth": "1"}]
    )
    ds = PromptDataset(f, tokenizer, prompt_key="question")
    assert ds[0]["prompt_text"] == "<|user|> solve for x <|assistant|>"


def test_tokenizer_from_path(tmp_path: Path, tokenizer: Any) -> None:
    tokenizer.save_pretrained(tmp_path / "tok")
    f = write_rows(tmp_path / "train.parquet", five_rows())
    ds = PromptDataset([f], str(tmp_path / "tok"))
    assert ds[1]["prompt_ids"] == tokenizer("<|user|> solve for x <|assistant|>")["input_ids"]


def test_without_chat_template(tmp_path: Path) -> None:
    tok = make_tokenizer(chat_template=None)
    f = write_rows(tmp_path / "train.parquet", five_rows())
    ds = PromptDataset([f], tok, apply_chat_template=False)
    assert ds[1]["prompt_text"] == "solve for x"
    assert len(ds[1]["prompt_ids"]) == 3


def test_missing_chat_template_names_tokenizer(tmp_path: Path) -> None:
    make_tokenizer(chat_template=None).save_pretrained(tmp_path / "base-model")
    f = write_rows(tmp_path / "train.parquet", five_rows())
    with pytest.raises(DataError) as err:
        PromptDataset([f], str(tmp_path / "base-model"))
    msg = str(err.value)
    assert f"tokenizer '{tmp_path / 'base-model'}' has no chat template" in msg
    assert "apply_chat_template=False" in msg


def test_missing_column_fails_before_the_tokenizer_loads(tmp_path: Path) -> None:
    f = write_rows(
        tmp_path / "bad.parquet", [{"prompt": [{"role": "user", "content": "x"}], "ground_truth": "1"}]
    )
    # the tokenizer path does not exist: the schema error must come first
    with pytest.raises(SchemaError, match=f"{f}: missing column\\(s\\) 'data_source'"):
        PromptDataset([f], str(tmp_path / "no-such-tokenizer"))


def test_chat_template_kwargs(tmp_path: Path) -> None:
    tok = make_tokenizer(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if think %} <|system|>{% endif %}"
    )
    f = write_rows(tmp_path / "train.parquet", five_rows()[:1])
    ds = PromptDataset([f], tok, chat_template_kwargs={"think": True})
    assert ds[0]["prompt_text"] == "what is one plus one <|system|>"


# ---------------------------------------------------------------------------------------------
# filtering
# ---------------------------------------------------------------------------------------------
def bad_rows() -> list[dict[str, Any]]:
    return [
        chat_row("what is one plus one", "2"),  # ok, 7 tokens
        chat_row("solve for x", None),  # missing_ground_truth
        chat_row("find x", "  "),  # missing_ground_truth (blank)
        chat_row("", "1"),  # empty_prompt
        chat_row("what is one plus one plus one plus one", "4"),  # 9 words -> 11 tokens: too_long
        chat_row("find x", "5"),  # ok, 4 tokens
    ]


def test_filter_counts_and_reasons(tmp_path: Path, tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    f = write_rows(tmp_path / "train.parquet", bad_rows())
    with caplog.at_level(logging.INFO, logger="rlzoo.data"):
        ds = PromptDataset([f], tokenizer, max_prompt_length=8)
    assert [ds[i]["ground_truth"] for i in range(len(ds))] == ["2", "5"]
    st = ds.filter_stats
    assert st.total == 6 and st.kept == 2
    assert st.dropped == {"missing_ground_truth": 2, "empty_prompt": 1, "too_long": 1}
    assert st.as_dict() == {
        "total": 6,
        "kept": 2,
        "truncated": 0,
        "dropped/empty_prompt": 1,
        "dropped/missing_ground_truth": 2,
        "dropped/too_long": 1,
    }
    assert f"{f} row 4: 11 tokens" in st.examples["too_long"][0]
    assert (
        "dropped 2 of 6 prompt row(s): no ground truth (null or empty) [missing_ground_truth]" in caplog.text
    )
    assert (
        "dropped 1 of 6 prompt row(s): prompt longer than max_prompt_length tokens [too_long]" in caplog.text
    )
    assert "kept 2, dropped 4" in caplog.text


def test_strict_mode_lists_every_bad_row(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(tmp_path / "train.parquet", bad_rows())
    with pytest.raises(DataError) as err:
        PromptDataset([f], tokenizer, max_prompt_length=8, strict=True)
    msg = str(err.value)
    assert "4 of 6 prompt row(s)" in msg and "(strict mode)" in msg
    assert "2 row(s): no ground truth (null or empty) [missing_ground_truth]" in msg
    assert f"e.g. {f} row 1" in msg and f"e.g. {f} row 2" in msg
    assert "1 row(s): empty prompt" in msg and f"e.g. {f} row 3" in msg
    assert "[too_long]" in msg and f"e.g. {f} row 4: 11 tokens" in msg


def test_truncation_error(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(tmp_path / "train.parquet", five_rows())
    with pytest.raises(
        DataError, match=r"(?s)1 prompt\(s\) are longer than max_prompt_length=8.*row 2: 9 tokens"
    ):
        PromptDataset([f], tokenizer, max_prompt_length=8, truncation="error")


def test_truncation_left_and_right(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(tmp_path / "train.parquet", [chat_row("what is one plus one plus one", "3")])
    full = tokenizer("<|user|> what is one plus one plus one <|assistant|>")["input_ids"]  # 9 tokens
    left = PromptDataset([f], tokenizer, max_prompt_length=4, truncation="left")
    assert left[0]["prompt_ids"] == full[-4:]
    assert left[0]["prompt_text"] == "one plus one <|assistant|>"  # the last 4 tokens
    assert left.filter_stats.truncated == 1 and left.filter_stats.dropped == {}
    right = PromptDataset([f], tokenizer, max_prompt_length=4, truncation="right")
    assert right[0]["prompt_ids"] == full[:4]


def test_all_rows_filtered_is_an_error(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(tmp_path / "train.parquet", [chat_row("find x", None)])
    with pytest.raises(DataError, match="no usable prompt"):
        PromptDataset([f], tokenizer)


def test_bad_arguments(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(tmp_path / "train.parquet", five_rows())
    with pytest.raises(ValueError, match="truncation must be one of"):
        PromptDataset([f], tokenizer, truncation="middle")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# images
# ---------------------------------------------------------------------------------------------
def image_rows() -> list[dict[str, Any]]:
    return [
        chat_row("<image>find x", "1", images=[{"bytes": png_bytes(), "path": None}]),
        chat_row("<image>find x", "2", images=[{"bytes": b"not an image", "path": None}]),
        chat_row("<image>solve for x", "3", images=[{"bytes": None, "path": "missing.png"}]),
        chat_row("find x", "4", images=None),
    ]


def test_images_decoded_and_unreadable_filtered(tmp_path: Path, tokenizer: Any) -> None:
    from PIL import Image

    f = write_rows(tmp_path / "geo.parquet", image_rows())
    ds = PromptDataset([f], tokenizer)
    assert [ds[i]["ground_truth"] for i in range(len(ds))] == ["1", "4"]
    assert ds.filter_stats.dropped == {"unreadable_image": 2}
    img = ds[0]["images"][0]
    assert isinstance(img, Image.Image) and img.size == (4, 3)
    assert ds[1]["images"] is None
    # no processor: the placeholder stays literal text
    assert ds[0]["prompt_text"] == "<|user|> <image>find x <|assistant|>"


def test_image_path_relative_to_the_file(tmp_path: Path, tokenizer: Any) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(png_bytes((1, 2, 3)))
    f = write_rows(
        tmp_path / "geo.parquet",
        [chat_row("<image>find x", "1", images=[{"bytes": None, "path": "imgs/a.png"}])],
    )
    ds = PromptDataset([f], tokenizer)
    assert ds[0]["images"][0].getpixel((0, 0)) == (1, 2, 3)


class FakeProcessor:
    """A processor whose template renders image entries as <image> and expands each to 3 tokens."""

    chat_template = "fake"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.seen: list[Any] = []

    def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> str:
        self.seen.append(messages)
        parts = []
        for m in messages:
            c = m["content"]
            text = (
                c
                if isinstance(c, str)
                else " ".join("<image>" if p["type"] == "image" else p["text"] for p in c)
            )
            parts.append(f"<|{m['role']}|> {text}")
        return " ".join(parts) + " <|assistant|>"

    def __call__(self, text: list[str], images: list[Any], return_tensors: Any = None) -> dict[str, Any]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"input_ids": [row + [0] * (2 * len(images)) for row in ids]}  # each image -> 3 tokens


def test_processor_gets_structured_content_and_counts_image_tokens(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(
        tmp_path / "geo.parquet",
        [
            chat_row("<image>find x", "1", images=[{"bytes": png_bytes(), "path": None}]),
            chat_row("<image>solve for x", "2", images=[{"bytes": png_bytes(), "path": None}]),
        ],
    )
    proc = FakeProcessor(tokenizer)
    # row 0: "<|user|> <image> find x <|assistant|>" = 5 tokens + 2 image = 7; row 1: 6 + 2 = 8
    ds = PromptDataset([f], None, processor=proc, max_prompt_length=7)
    assert proc.seen[0] == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "find x"}]}
    ]
    assert len(ds) == 1 and ds.filter_stats.dropped == {"too_long": 1}
    assert ds[0]["prompt_text"] == "<|user|> <image> find x <|assistant|>"


# ---------------------------------------------------------------------------------------------
# PromptLoader
# ---------------------------------------------------------------------------------------------
class Items:
    """The smallest dataset a loader needs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, int]:
        return {"index": i}


def ids(batch: list[dict[str, Any]]) -> list[int]:
    return [item["index"] for item in batch]


def flat(batches: Any) -> list[int]:
    return [item["index"] for batch in batches for item in batch]


def take(loader: PromptLoader, k: int) -> list[list[int]]:
    return [ids(next(loader)) for _ in range(k)]


def test_loader_deterministic_for_a_seed() -> None:
    a, b, c = (
        PromptLoader(Items(10), 3, seed=1),
        PromptLoader(Items(10), 3, seed=1),
        PromptLoader(Items(10), 3, seed=2),
    )
    got = take(a, 9)
    assert got == take(b, 9)
    assert got != take(c, 9)
    assert len(a) == 3  # 10 // 3 with drop_last


def test_loader_each_epoch_is_a_permutation() -> None:
    loader = PromptLoader(Items(10), 3, seed=0, drop_last=False)
    assert len(loader) == 4
    epochs = [flat(loader.epoch_batches()) for _ in range(3)]
    for ep in epochs:
        assert sorted(ep) == list(range(10))  # every prompt once per epoch: none lost
    assert epochs[0] != epochs[1]  # reshuffled each epoch
    assert [len(b) for b in PromptLoader(Items(10), 3, drop_last=False).epoch_batches()] == [3, 3, 3, 1]


def test_loader_drop_last_never_repeats_within_an_epoch() -> None:
    loader = PromptLoader(Items(10), 3, seed=0)
    for epoch in range(4):
        batches = list(loader.epoch_batches())
        assert [len(b) for b in batches] == [3, 3, 3]
        served = flat(batches)
        assert len(set(served)) == 9
        assert served == loader.order(epoch)[:9]


def test_loader_no_shuffle_in_order() -> None:
    loader = PromptLoader(Items(5), 2, shuffle=False, drop_last=False)
    assert take(loader, 4) == [[0, 1], [2, 3], [4], [0, 1]]
    assert loader.epoch == 1


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3, 4, 7])
def test_loader_resume_continues_exactly(stop_after: int) -> None:
    """state_dict after k batches -> a new loader yields the same remaining batches (across epochs)."""
    ref = PromptLoader(Items(10), 3, seed=7)
    expected = take(ref, stop_after + 8)

    first = PromptLoader(Items(10), 3, seed=7)
    done = take(first, stop_after)
    state = first.state_dict()
    resumed = PromptLoader(Items(10), 3, seed=123)  # the seed comes from the state
    resumed.load_state_dict(state)
    assert done + take(resumed, 8) == expected


def test_loader_resume_with_another_batch_size_loses_nothing() -> None:
    first = PromptLoader(Items(12), 4, seed=3, drop_last=False)
    seen = [i for b in take(first, 2) for i in b]  # 8 of the 12 prompts of epoch 0
    resumed = PromptLoader(Items(12), 3, drop_last=False)
    resumed.load_state_dict(first.state_dict())
    rest = flat(resumed.epoch_batches())
    assert sorted(seen + rest) == list(range(12))
    assert resumed.epoch == 0


def test_loader_state_dict_fields_and_mismatch() -> None:
    loader = PromptLoader(Items(10), 3, seed=5)
    take(loader, 4)  # 3 batches end epoch 0 (1 prompt dropped), the 4th starts epoch 1
    assert loader.state_dict() == {
        "epoch": 1,
        "position": 3,
        "seed": 5,
        "shuffle": True,
        "drop_last": True,
        "dataset_size": 10,
    }
    other = PromptLoader(Items(11), 3)
    with pytest.raises(DataError, match="taken over 10 prompts, this dataset has 11"):
        other.load_state_dict(loader.state_dict())


def test_loader_num_epochs() -> None:
    loader = PromptLoader(Items(4), 2, num_epochs=2)
    assert len(list(loader)) == 4
    assert list(loader.epoch_batches()) == []


def test_loader_too_small_for_one_batch() -> None:
    with pytest.raises(DataError, match="fewer than one batch of 8"):
        PromptLoader(Items(3), 8)


def test_loader_over_prompt_dataset(tmp_path: Path, tokenizer: Any) -> None:
    f = write_rows(tmp_path / "train.parquet", five_rows())
    ds = PromptDataset([f], tokenizer)
    loader = PromptLoader(ds, 2, seed=0)
    batch = next(loader)
    assert len(batch) == 2 and all("prompt_ids" in item for item in batch)
    state = loader.state_dict()
    again = PromptLoader(PromptDataset([f], tokenizer), 2)
    again.load_state_dict(state)
    assert ids(next(again)) == ids(next(loader))


# ---------------------------------------------------------------------------------------------
# unreadable files and answers of the wrong type
# ---------------------------------------------------------------------------------------------
def test_parquet_corrupted_mid_file_names_the_file(tmp_path: Path, tokenizer: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    rows = [chat_row(f"question number {i} " + "x" * 200, ground_truth=str(i)) for i in range(200)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")  # the footer (schema) stays intact
    end = len(data) - 8 - footer  # the column chunks end here
    data[4 : end - 4] = b"\xff" * (end - 8)  # a write that died mid-file
    path.write_bytes(bytes(data))
    pq.read_schema(path)  # the columns still check out
    with pytest.raises(DataError) as e:
        PromptDataset([str(path)], tokenizer, max_prompt_length=512)
    assert str(path) in str(e.value) and "corrupt" in str(e.value)


def test_ground_truth_must_be_a_string_or_a_number(tmp_path: Path, tokenizer: Any) -> None:
    listy = write_rows(tmp_path / "list.parquet", [chat_row("q", ground_truth=["4", "four"])])
    with pytest.raises(SchemaError, match=r"'reward_model.ground_truth' must hold the answer as a string"):
        PromptDataset([str(listy)], tokenizer, max_prompt_length=512)
    flat = write_rows(
        tmp_path / "flat.parquet",
        [{k: v for k, v in chat_row("q").items() if k != "reward_model"} | {"ground_truth": [1]}],
    )
    with pytest.raises(SchemaError, match=r"'ground_truth' must hold the answer as a string .*got list"):
        PromptDataset([str(flat)], tokenizer, max_prompt_length=512)
    # numbers are read as their decimal text
    for name, numbers, texts in [("num", (18, 7), ["18", "7"]), ("f", (2.0, 0.5), ["2", "0.5"])]:
        path = write_rows(
            tmp_path / f"{name}.parquet", [chat_row(q, ground_truth=n) for q, n in zip("ab", numbers)]
        )
        dataset = PromptDataset([str(path)], tokenizer, max_prompt_length=512)
        assert [item["ground_truth"] for item in dataset] == texts
