"""Granite (``model_type`` granite, IBM Granite-3.x dense): a Llama with four multipliers: the embedding x
embedding_multiplier, each residual branch x residual_multiplier, attention scores x attention_multiplier (in
place of 1/sqrt(head_dim)) and the logits / logits_scaling."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, register

# GraniteConfig (transformers 5.24)
GRANITE_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(32000, 4096, 11008, 32, 32, None, 2048, 1e-6), "attention_bias": False, "mlp_bias": False,
    "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0})


def read_granite(r: HFReader) -> None:
    llama_like(r)
    r.arch["mlp_bias"] = r.flag("mlp_bias")
    granite_multipliers(r)


def granite_multipliers(r: HFReader) -> None:
    """The attention's bias (attention_bias) and Granite's four multipliers (Granite-3.x and Granite-4.0-H)."""
    bias = r.flag("attention_bias")
    m = {k: r.number(k) for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                  "logits_scaling")}
    r.arch.update(qkv_bias=bias, o_bias=bias,
                  embed_multiplier=m["embedding_multiplier"] if m["embedding_multiplier"] != 1.0 else 0.0,
                  residual_multiplier=m["residual_multiplier"] if m["residual_multiplier"] != 1.0 else 0.0,
                  query_scale=m["attention_multiplier"], logits_scaling=m["logits_scaling"] if
                  m["logits_scaling"] != 1.0 else 0.0)


register(Family("granite", read_granite, keys=GRANITE_KEYS))
