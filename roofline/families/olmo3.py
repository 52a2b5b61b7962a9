"""OLMo-3 (``model_type`` olmo3): OLMo-2's layer (norms after attention and the MLP only, qk-norm over the whole
q and k projections) with sliding-window layers: layer_types, else every 4th layer full and the rest over
sliding_window (4,096). Each layer type has its own RoPE (rope_parameters keyed by full_attention /
sliding_attention; a 4.x config's rope_scaling, YaRN in the published ones, is the full layers' alone: the sliding
layers rotate plainly). Not split under --tp (OLMo-2's whole-projection qk-norm). transformers' Olmo3Config and
modeling file."""

from __future__ import annotations

from ..config_fields import show_value
from ..errors import RooflineError
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .olmo2 import read_olmo2
from .reader import HFReader, Keys, rope_theta, yarn
from .registry import Family, register

DEFAULT_THETA = 500000.0      # Olmo3Config.default_theta: every layer type's base unless the config says one

# Olmo3Config (transformers 5.24)
OLMO3_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(50304, 4096, 11008, 32, 32, None, 2048, 1e-5, theta=DEFAULT_THETA), "attention_bias": False,
    "sliding_window": 4096, "layer_types": None})


def read_olmo3(r: HFReader) -> None:
    read_olmo2(r)
    if r.d.get("layer_types") is None and r.d.get("sliding_window") is not None:   # Olmo3Config's pattern
        r.d["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
                              for i in range(r.d["num_hidden_layers"])]
    r.arch["sliding_window"], r.arch["layer_types"] = r.window()


def _kind(spec: dict) -> str:
    return spec.get("rope_type", spec.get("type", "default"))


def olmo3_rope(r: HFReader) -> float:
    """The full layers' RoPE base (their YaRN into ``r.arch["rope_yarn"]``, other scaling a note) and the sliding
    layers' plain base into ``r.arch["rope_local_theta"]``: from rope_parameters keyed by layer type (5.x) or
    rope_theta + rope_scaling at the top (4.x: the scaling is the full layers' only)."""
    params, top = r.d.get("rope_parameters"), r.d.get("rope_theta")
    if params is not None and not (isinstance(params, dict) and {"full_attention", "sliding_attention"} & set(params)):
        r.refuse("rope_parameters", "is not keyed by layer type, which is not read for olmo3 (transformers 5.24 "
                                    "ignores it, vLLM reads it): give full_attention and sliding_attention entries")
    params = params or {}
    scaling = r.d.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        r.refuse("rope_scaling", "must be an object such as {\"rope_type\": \"yarn\", \"factor\": 8.0} or null")
    full = {**(params.get("full_attention") or {}), **(scaling or {})}
    sliding = dict(params.get("sliding_attention") or {})
    if "rope_theta" not in sliding and top is not None and float(top) != DEFAULT_THETA:
        raise RooflineError(f"{r.where}: olmo3: rope_theta = {show_value(top)} with no base for the sliding layers "
                            f"is not modelled: transformers 5.24 rotates them at {DEFAULT_THETA:g}, 4.57 and vLLM at "
                            "rope_theta; give rope_parameters.sliding_attention.rope_theta.")
    full.setdefault("rope_theta", DEFAULT_THETA if top is None else top)
    sliding.setdefault("rope_theta", DEFAULT_THETA)
    for kind, spec in (("full_attention", full), ("sliding_attention", sliding)):
        if spec.get("partial_rotary_factor", 1.0) != 1.0:
            r.refuse("rope_parameters", f"says a partial_rotary_factor for {kind}, which is not modelled here "
                                        "(RoPE rotates every head dimension)")
    if _kind(sliding) == "yarn":
        r.refuse("rope_parameters", "gives the sliding layers YaRN, which is not modelled (only the full layers' "
                                    "RoPE is scaled)")
    if _kind(full) == "yarn" and full.get("truncate", True) is not True:
        r.refuse("rope_parameters", "says truncate false for the full layers' YaRN, which transformers 5.24 does "
                                    "not read per layer type, so it is not modelled")
    thetas = {}
    for kind, spec in (("full_attention", full), ("sliding_attention", sliding)):
        notes = []
        thetas[kind] = rope_theta({"rope_parameters": spec}, r.where, notes)
        r.notes += [n.replace("rope_parameters", f"rope_parameters.{kind}") for n in notes if '"yarn"' not in n]
    if _kind(full) == "yarn":
        r.arch["rope_yarn"] = yarn(HFReader({"rope_parameters": full, "max_position_embeddings":
                                             r.d.get("max_position_embeddings")}, r.where, r.mtype))
    r.arch["rope_local_theta"] = thetas["sliding_attention"]
    return thetas["full_attention"]


register(Family("olmo3", read_olmo3, keys=OLMO3_KEYS, rope=olmo3_rope))
