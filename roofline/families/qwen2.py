"""Qwen2 (``model_type`` qwen2): a Llama with biases on q/k/v, and Qwen's sliding-window switch."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, preset, register


def qwen_window(r: HFReader) -> None:
    """Qwen's window: off unless use_sliding_window, and then only from max_window_layers on."""
    r.arch["sliding_window"], r.arch["layer_types"] = r.window("use_sliding_window", max_window_layers=True)


# Qwen's window keys (Qwen2Config, transformers 5.24: a 4,096 window where use_sliding_window turns it on)
QWEN_WINDOW_KEYS = Keys({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
                         "layer_types": None})
# use_mrope (Qwen2.5's configs: false): Qwen2-VL's multimodal RoPE, which rotates text positions as plain RoPE
QWEN2_KEYS = LLAMA_LIKE_KEYS + QWEN_WINDOW_KEYS + Keys(sizes(151936, 4096, 22016, 32, 32, 32, 32768, 1e-6),
                                                       irrelevant=("use_mrope",))


def read_qwen2(r: HFReader) -> None:
    llama_like(r)
    r.arch["qkv_bias"] = True       # Qwen2's q/k/v projections always carry biases; o_proj has none
    qwen_window(r)


register(Family("qwen2", read_qwen2, keys=QWEN2_KEYS, presets=(
    preset("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 32768, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True,
           source="Qwen/Qwen2.5-7B-Instruct: q/k/v biases; use_sliding_window false"),
)))
