"""Qwen3 (``model_type`` qwen3): a Llama with qk-norm (RMSNorm over each head's q and k before RoPE)."""

from __future__ import annotations

from .llama import llama_like
from .qwen2 import qwen_window
from .reader import HFReader
from .registry import Family, preset, register


def qwen3_attention(r: HFReader) -> None:
    """Qwen3's attention (shared by Qwen3-MoE): attention_bias on q/k/v/o, and qk-norm."""
    bias = r.flag("attention_bias")
    r.arch.update(qkv_bias=bias, o_bias=bias, qk_norm=True)


def read_qwen3(r: HFReader) -> None:
    llama_like(r)
    qwen3_attention(r)
    qwen_window(r)


register(Family("qwen3", read_qwen3, presets=(
    preset("qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 40960, head_dim=128, rope_theta=1e6, rms_eps=1e-6,
           qk_norm=True, source="Qwen/Qwen3-8B: qk-norm, head_dim 128 (not hidden/heads), no biases"),
)))
