"""OLMo-2 (``model_type`` olmo2): a Llama whose norms come after attention and after the MLP (no norm before
either: post_attention_layernorm, post_feedforward_layernorm), with qk-norm over the whole q and k projections
(before RoPE); no biases. Not split under --tp (its whole-projection qk-norm)."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, register

# Olmo2Config (transformers 5.24)
OLMO2_KEYS = LLAMA_LIKE_KEYS + Keys({**sizes(50304, 4096, 11008, 32, 32, None, 2048, 1e-5), "attention_bias": False})


def read_olmo2(r: HFReader) -> None:
    llama_like(r)
    bias = r.flag("attention_bias")
    r.arch.update(qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_whole=True, pre_norms=False,
                  sandwich_norms=True)


register(Family("olmo2", read_olmo2, keys=OLMO2_KEYS))
