"""Vision-language prompts through the native path (rlzoo.backends.native.multimodal), on a CPU.

A tiny Qwen2.5-VL (built from its config, ~100k parameters) and a Qwen2.5-VL processor built
offline: image tokens are expanded, M-RoPE positions come from the model's rope index, a KV-cache
generation loop laid out like the native engine's (left-padded prefill with pixels, then decode
steps at ``pos + rope_deltas``) gives the same log-probs as the trainer's full forward.
"""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlzoo.backends.native import multimodal as mm  # noqa: E402
from rlzoo.testing.tiny import build_tiny_qwen2_5_vl, png_bytes  # noqa: E402


@pytest.fixture(scope="module")
def vl() -> tuple[object, object]:
    return build_tiny_qwen2_5_vl(seed=0)


def image(color: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> object:
    from PIL import Image

    return Image.open(io.BytesIO(png_bytes(color, size)))


def render(processor: object, text: str) -> str:
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    return processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]


def test_expand_prompt_puts_one_token_per_merged_patch(vl: tuple[object, object]) -> None:
    model, processor = vl
    # 56x56 -> 4x4 patches of 14 px; 2x2 merge -> 4 image tokens. 112x56 -> 8x4 patches -> 8 tokens
    for size, n_tokens in (((56, 56), 4), ((112, 56), 8)):
        ids, inputs = mm.expand_prompt(processor, render(processor, "Find x"), [image((1, 2, 3), size)])
        assert ids.count(model.config.image_token_id) == n_tokens
        grid = inputs["image_grid_thw"]
        assert grid.tolist()[0][0] == 1 and int(grid.prod()) // 4 == n_tokens
        assert inputs["pixel_values"].shape[0] == int(grid.prod())


def test_rope_positions_of_text_only_rows_are_plain_positions(vl: tuple[object, object]) -> None:
    model, _ = vl
    ids = torch.tensor([[0, 0, 20, 21, 22], [20, 21, 22, 23, 24]])  # row 0 left-padded by 2 (text tokens)
    attn = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos, deltas = mm.rope_position_ids(model, ids, attn, None)
    assert pos.shape == (3, 2, 5)
    assert pos[:, 0, 2:].tolist() == [[0, 1, 2]] * 3 and pos[:, 1].tolist() == [[0, 1, 2, 3, 4]] * 3
    assert deltas.flatten().tolist() == [0, 0]


@torch.no_grad()
def test_kv_cache_generation_matches_the_trainer_forward(vl: tuple[object, object]) -> None:
    model, processor = vl
    cfg = model.config
    prompts = [
        mm.expand_prompt(processor, render(processor, "Find x"), [image((200, 0, 0))]),
        mm.expand_prompt(processor, render(processor, "Find x the is 3 4"), [image((0, 0, 200), (112, 56))]),
    ]
    P = max(len(ids) for ids, _ in prompts)
    pad = processor.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (P - len(p)) + p for p, _ in prompts])  # [2, P], left-padded
    attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p, _ in prompts])  # [2, P]
    images = mm.collate_images([inputs for _, inputs in prompts])
    assert images["image_grid_thw"].shape == (2, 3)

    # rollout: prefill with pixels and M-RoPE positions, then decode greedily with the KV cache
    pos, deltas = mm.rope_position_ids(model, ids, attn, images["image_grid_thw"])
    out = model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=pos,
        use_cache=True,
        mm_token_type_ids=mm.mm_token_type_ids(ids, cfg),
        **images,
    )
    cache, logits = out.past_key_values, out.logits[:, -1]
    lengths = attn.sum(-1)  # [2]: next token's index in each unpadded sequence
    mask, toks, lps = attn, [], []
    for k in range(5):
        lp = logits.float().log_softmax(-1)  # [2, V]
        tok = lp.argmax(-1)  # [2]
        toks.append(tok)
        lps.append(lp.gather(-1, tok[:, None]).squeeze(-1))
        mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
        step_pos = mm.decode_position_ids(deltas, (lengths + k)[:, None])  # [3, 2, 1]
        out = model(
            input_ids=tok[:, None],
            attention_mask=mask,
            position_ids=step_pos,
            past_key_values=cache,
            use_cache=True,
        )
        cache, logits = out.past_key_values, out.logits[:, -1]
    responses = torch.stack(toks, 1)  # [2, T]
    rollout_lp = torch.stack(lps, 1)  # [2, T]

    # trainer: one forward over prompt + response in rlzoo's batch layout
    full_ids = torch.cat([ids, responses], 1)
    full_attn = torch.cat([attn, torch.ones_like(responses)], 1)
    train_lp = mm.vl_token_log_probs(model, full_ids, full_attn, responses, images)
    torch.testing.assert_close(train_lp, rollout_lp, atol=1e-4, rtol=1e-4)

    # the pixels matter: other images give other log-probs
    other = mm.collate_images(
        [mm.expand_prompt(processor, render(processor, "Find x"), [image((0, 255, 0))])[1], prompts[1][1]]
    )
    assert not torch.allclose(
        mm.vl_token_log_probs(model, full_ids, full_attn, responses, other)[0], train_lp[0]
    )


def test_log_probs_have_gradients_for_the_update(vl: tuple[object, object]) -> None:
    model, processor = vl
    ids, inputs = mm.expand_prompt(processor, render(processor, "Find x"), [image((9, 9, 9))])
    resp = torch.tensor([[20, 21, 1]])  # two words, then <eos>
    full = torch.cat([torch.tensor([ids]), resp], 1)
    lp = mm.vl_token_log_probs(model, full, torch.ones_like(full), resp, inputs)
    lp.sum().backward()
    visual = [p for n, p in model.named_parameters() if "visual" in n and p.grad is not None]
    assert visual and any(float(p.grad.abs().sum()) > 0 for p in visual)  # the vision tower learns too
    model.zero_grad()
