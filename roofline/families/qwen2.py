"""Qwen2 (``model_type`` qwen2): a Llama with biases on q/k/v, and Qwen's sliding-window switch."""

from __future__ import annotations

from .llama import llama_like
from .reader import HFReader
from .registry import Family, preset, register


def qwen_window(r: HFReader) -> None:
    """Qwen's window: off unless use_sliding_window, and then only from max_window_layers on."""
    r.arch["sliding_window"], r.arch["layer_types"] = r.window("use_sliding_window", max_window_layers=True)


def read_qwen2(r: HFReader) -> None:
    llama_like(r)
    r.arch["qkv_bias"] = True       # Qwen2's q/k/v projections always carry biases; o_proj has none
    qwen_window(r)


register(Family("qwen2", read_qwen2, presets=(
    preset("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 32768, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True,
           source="Qwen/Qwen2.5-7B-Instruct: q/k/v biases; use_sliding_window false"),
)))
