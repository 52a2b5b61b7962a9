"""Seed-OSS (``model_type`` seed_oss, ByteDance-Seed): a Llama whose q/k/v biases (attention_bias, on by
default) and o_proj bias (attention_out_bias, off by default) are separate switches; head_dim 128 unless the
config says otherwise. Its residual_dropout is training-only (transformers' SeedOssConfig and modeling file)."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, register

# SeedOssConfig (transformers 5.24)
SEED_OSS_KEYS = LLAMA_LIKE_KEYS + Keys(
    {**sizes(155136, 4096, 27648, 64, 80, 8, 524288, 1e-6, head_dim=128), "attention_bias": True,
     "attention_out_bias": False, "mlp_bias": False},
    irrelevant=("residual_dropout",))


def read_seed_oss(r: HFReader) -> None:
    llama_like(r)
    r.arch.update(qkv_bias=r.flag("attention_bias", True), o_bias=r.flag("attention_out_bias"),
                  mlp_bias=r.flag("mlp_bias"))


register(Family("seed_oss", read_seed_oss, keys=SEED_OSS_KEYS))
