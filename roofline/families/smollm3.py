"""SmolLM3 (``model_type`` smollm3): a Llama whose every ``no_rope_layer_interval``-th layer applies no RoPE
(NoPE: ``no_rope_layers`` 1 rotates, 0 does not), tied embeddings; a window, where use_sliding_window turns it
on, only over the NoPE layers unless layer_types says otherwise (transformers' SmolLM3Config)."""

from __future__ import annotations

from ..errors import RooflineError
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, register

# SmolLM3Config (transformers 5.24)
SMOLLM3_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(128256, 2048, 11008, 36, 16, 4, 32768, 1e-6, tie=True, theta=2000000.0), "attention_bias": False,
    "mlp_bias": False, "use_sliding_window": False, "sliding_window": None, "layer_types": None,
    "no_rope_layers": None, "no_rope_layer_interval": 4})


def _rotates(r: HFReader) -> list:
    """Per layer, whether it applies RoPE (no_rope_layers, or every no_rope_layer_interval-th layer without)."""
    n = r.d["num_hidden_layers"]
    flags = r.d.get("no_rope_layers")
    if flags is None:
        every = r.count("no_rope_layer_interval", 4)
        return [(i + 1) % every != 0 for i in range(n)]
    if not isinstance(flags, list) or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        r.refuse("no_rope_layers", "is not modelled (give 1 (RoPE) or 0 (NoPE) per layer)")
    if len(flags) != n:
        raise RooflineError(f"{r.where}: no_rope_layers has {len(flags)} entries for num_hidden_layers {n}: give "
                            "one per layer.")
    return [bool(f) for f in flags]


def read_smollm3(r: HFReader) -> None:
    llama_like(r)
    bias = r.flag("attention_bias")
    rotates = _rotates(r)
    if r.d.get("layer_types") is None and r.flag("use_sliding_window") and r.d.get("sliding_window") is not None:
        r.d["layer_types"] = ["full_attention" if rope else "sliding_attention" for rope in rotates]
    w, types = r.window("use_sliding_window")
    r.arch.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.flag("mlp_bias"), sliding_window=w, layer_types=types,
                  nope_layers=tuple(i for i, rope in enumerate(rotates) if not rope))


register(Family("smollm3", read_smollm3, keys=SMOLLM3_KEYS))
