"""Qwen3 (``model_type`` qwen3): a Llama with qk-norm (RMSNorm over each head's q and k before RoPE)."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .qwen2 import QWEN_WINDOW_KEYS, qwen_window
from .reader import HFReader, Keys
from .registry import Family, preset, register


def qwen3_attention(r: HFReader) -> None:
    """Qwen3's attention (shared by Qwen3-MoE): attention_bias on q/k/v/o, and qk-norm."""
    bias = r.flag("attention_bias")
    r.arch.update(qkv_bias=bias, o_bias=bias, qk_norm=True)


# Qwen3Config (transformers 5.24): head_dim 128 whatever hidden / heads; Qwen3-Next's gated attention refused
QWEN3_ATTENTION_KEYS = Keys({"attention_bias": False}, refused={
    "attn_output_gate": ("gated attention (q_proj's output doubled for a sigmoid gate: Qwen3-Next, Qwen3.5)",
                         (None, False))})
QWEN3_KEYS = LLAMA_LIKE_KEYS + QWEN_WINDOW_KEYS + QWEN3_ATTENTION_KEYS + Keys(
    sizes(151936, 4096, 22016, 32, 32, 32, 32768, 1e-6, head_dim=128))
# Qwen3VLTextConfig (Qwen3-VL's text model): Qwen3 without its window keys, RoPE base 500,000. Its mrope
# (rope_parameters.mrope_section) rotates text positions exactly as plain RoPE: a text-only step is Qwen3's.
QWEN3_VL_TEXT_KEYS = LLAMA_LIKE_KEYS + QWEN3_ATTENTION_KEYS + Keys(
    sizes(151936, 4096, 22016, 32, 32, 32, 128000, 1e-6, head_dim=128, theta=500000.0),
    rope=("mrope_section", "mrope_interleaved"))


def read_qwen3_vl_text(r: HFReader) -> None:
    llama_like(r)
    qwen3_attention(r)


def read_qwen3(r: HFReader) -> None:
    llama_like(r)
    qwen3_attention(r)
    qwen_window(r)


register(Family("qwen3", read_qwen3, keys=QWEN3_KEYS, presets=(
    preset("qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 40960, head_dim=128, rope_theta=1e6, rms_eps=1e-6,
           qk_norm=True, source="Qwen/Qwen3-8B: qk-norm, head_dim 128 (not hidden/heads), no biases"),
)))

register(Family("qwen3_vl_text", read_qwen3_vl_text, keys=QWEN3_VL_TEXT_KEYS, wrappers={
    "qwen3_vl": {"what": "Qwen3-VL, Qwen3VLForConditionalGeneration", "tie_word_embeddings": False,
                 "vision": ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}}))
