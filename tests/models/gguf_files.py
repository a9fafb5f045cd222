"""Writes tiny llama-architecture GGUF files (random weights, a byte-level BPE tokenizer) with ``gguf``.

The file is written the way llama.cpp's converter writes an HF llama: tensors renamed to GGUF
names and the q / k projection rows permuted into llama.cpp's rotary layout. Reading it back
must therefore undo the permutation to give the original model's logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (the byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def llama_cpp_permute(w: Any, n_head: int) -> Any:
    """llama.cpp's q/k row order for rotary embeddings (its HF -> GGUF converter's permutation)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(vocab_size: int, seed: int = 0) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    from rlzoo.models.tiny import tiny_llama_config

    torch.manual_seed(seed)
    cfg = tiny_llama_config(  # hidden 32, FFN 64, 2 layers, 4 heads / 2 KV heads
        vocab_size,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # RMSNorm weights start at 1: make them distinguishable
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model


def write_tiny_gguf(path: Path, seed: int = 0) -> Any:
    """Write a tiny llama GGUF to ``path``; return the HF model it was made from."""
    import gguf
    import numpy as np

    tokens = [*SPECIALS, *byte_chars(), "Ġ1", "Ġ2", "Ġ+"]
    merges = ["Ġ 1", "Ġ 2", "Ġ +"]
    model = tiny_llama(len(tokens), seed)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for name, p in model.state_dict().items():
        arr = p.detach().float().numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            continue  # tied: no output.weight tensor
        else:
            _, _, layer, rest = name.split(".", 3)
            mod = rest.rsplit(".", 1)[0]
            out = f"blk.{layer}.{names[mod]}.weight"
            if mod == "self_attn.q_proj":
                arr = llama_cpp_permute(arr, cfg.num_attention_heads)
            elif mod == "self_attn.k_proj":
                arr = llama_cpp_permute(arr, cfg.num_key_value_heads)
        w.add_tensor(out, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
