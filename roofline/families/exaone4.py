"""EXAONE-4.0 (``model_type`` exaone4, LG AI Research): OLMo-2's norms (after attention and the MLP only) with
qk-norm over each head's q and k, no biases; local layers over sliding_window and global ones (layer_types,
else every sliding_window_pattern-th layer global). Where a window is set, the global layers apply no RoPE
(NoPE) and the local ones do; with sliding_window null every layer is global and rotates (transformers'
Exaone4Config and modeling file: ``if self.sliding_window is None or self.is_sliding``)."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, register

# Exaone4Config (transformers 5.24)
EXAONE4_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(102400, 4096, 16384, 32, 32, 32, 2048, 1e-5), "sliding_window": 4096, "sliding_window_pattern": 4,
    "layer_types": None})


def read_exaone4(r: HFReader) -> None:
    llama_like(r)
    n, windowed = r.d["num_hidden_layers"], r.d.get("sliding_window") is not None
    if r.d.get("layer_types") is None:
        if not windowed:                         # no window: every layer global, with RoPE
            r.d["layer_types"] = ["full_attention"] * n
        else:
            if isinstance(r.d.get("sliding_window_pattern"), str):
                r.refuse("sliding_window_pattern", "is not read without layer_types (transformers 5.24 reads only "
                                                   "an integer: every n-th layer global): give layer_types")
            every = r.count("sliding_window_pattern", 4)
            r.d["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]
    w, types = r.window()
    full = [i for i in range(n) if (types[i] if types else "sliding" if w else "full") == "full"]
    r.arch.update(qk_norm=True, pre_norms=False, sandwich_norms=True, sliding_window=w, layer_types=types,
                  nope_layers=tuple(full) if windowed else ())


register(Family("exaone4", read_exaone4, keys=EXAONE4_KEYS))
