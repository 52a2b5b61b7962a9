"""Falcon-H1 (``model_type`` falcon_h1: transformers 5.24, configuration_falcon_h1.py / modeling_falcon_h1.py): every
layer runs attention and a Mamba-2 mixer side by side on the same normed input, their outputs summed
(layer_types "hybrid"), then a SwiGLU MLP.

The Mamba-2 mixer: in_proj (mamba_proj_bias) to z, x, B, C, dt of width mamba_d_ssm (or mamba_expand x hidden),
the conv1d (mamba_conv_bias), the SSD scan by mamba_chunk_size, then the gated RMSNorm in mamba_n_groups groups
when mamba_rms_norm (in mamba_norm_before_gate's order: norm(y) x silu(z) by default, ``mamba_norm_first``), else
y x silu(z) alone (``ModelConfig.mamba_norm``), and out_proj (projectors_bias, which must
equal mamba_proj_bias: one bias setting for both here). The attention: RoPE on every head dimension, biases with
attention_bias, k x key_multiplier.

Its multipliers (muP): each one that is not 1 is a per-layer ``scale`` op where it runs (ssm_in_multiplier on the
mixer's input, ssm_multipliers over in_proj's five outputs (the mup vector), ssm_out_multiplier on its output,
attention_in_multiplier, key_multiplier on k, attention_out_multiplier, mlp_multipliers on the gate and on
down's output); a multiplier of 1 costs nothing (a serving engine skips it; transformers' torch path multiplies the
mup vector anyway: not counted). embedding_multiplier is the embedding's scale, lm_head_multiplier the logits'
(``logits_scaling`` = 1 / it).
"""

from __future__ import annotations

from dataclasses import replace

from ..op_spec import OpSpec
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, register

# FalconH1Config (transformers 5.24): every field with its default
FALCON_H1_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(128000, 4096, 14336, 32, 32, 8, 8192, 1e-5), "mamba_d_ssm": 1024, "mamba_n_heads": 128,
    "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False, "time_step_limit": None,
    "mamba_rms_norm": False, "mamba_norm_before_gate": True,
    "projectors_bias": False, "lm_head_multiplier": 1.0, "embedding_multiplier": 1.0,
    "mlp_multipliers": None, "key_multiplier": 1.0, "attention_out_multiplier": 1.0, "attention_in_multiplier": 1.0,
    "ssm_multipliers": None, "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0, "attention_bias": False,
    "mlp_bias": False},
    # time_step_limit (default (0, inf)) is the prefill scan's dt clamp (ModelConfig.mamba_dt_min / max);
    # num_logits_to_keep: generation only; the published configs' attn_layer_indices and mamba_use_mlp are read by no
    # transformers code (every layer attends and has its MLP)
    irrelevant=("num_logits_to_keep", "attn_layer_indices", "mamba_use_mlp"))

_MULTIPLIERS = ("ssm_in_multiplier", "ssm_out_multiplier", "attention_in_multiplier", "key_multiplier",
                "attention_out_multiplier", "lm_head_multiplier", "embedding_multiplier")


def _multipliers(r: HFReader) -> dict:
    """Every multiplier as a float (lists: mlp_multipliers [gate, down], ssm_multipliers [z, x, B, C, dt])."""
    out = {k: float(r.get(k, 1.0)) for k in _MULTIPLIERS}
    for k, n in (("mlp_multipliers", 2), ("ssm_multipliers", 5)):
        v = r.get(k, [1.0] * n)
        if not isinstance(v, list) or len(v) != n or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                                         for x in v):
            r.refuse(k, f"must list {n} numbers")
        out[k] = tuple(float(x) for x in v)
    for k, v in out.items():
        if any(x <= 0 for x in (v if isinstance(v, tuple) else (v,))):
            r.refuse(k, "must be positive")
    return out


def read_falcon_h1(r: HFReader) -> None:
    llama_like(r)
    n, H = r.d["num_hidden_layers"], r.d["hidden_size"]
    heads, groups = r.count("mamba_n_heads", 128), r.count("mamba_n_groups", 1)
    inner = r.count("mamba_d_ssm", 1024) if r.d.get("mamba_d_ssm", 1024) is not None else r.count("mamba_expand", 2) * H
    d_head = r.get("mamba_d_head", "auto")
    d_head = inner // heads if d_head == "auto" else r.count("mamba_d_head", 0)
    if heads * d_head != inner or heads % groups:
        r.refuse("mamba_n_heads", f"x mamba_d_head {d_head} must be the Mamba width ({inner}), and mamba_n_groups "
                                  "must divide it")
    if r.flag("projectors_bias") != r.flag("mamba_proj_bias"):
        r.refuse("projectors_bias", "differs from mamba_proj_bias (in_proj's bias): one bias setting for both is "
                                    "modelled")
    bias = r.flag("attention_bias")
    m = _multipliers(r)
    r.arch.update(
        layer_types=("hybrid",) * n, qkv_bias=bias, o_bias=bias, mlp_bias=r.flag("mlp_bias"),
        mamba_heads=heads, mamba_head_dim=d_head, mamba_state=r.count("mamba_d_state", 256), mamba_groups=groups,
        mamba_conv=r.count("mamba_d_conv", 4), mamba_chunk=r.count("mamba_chunk_size", 256),
        mamba_conv_bias=r.flag("mamba_conv_bias", True), mamba_proj_bias=r.flag("mamba_proj_bias"),
        mamba_norm=r.flag("mamba_rms_norm"), **r.dt_limit(),
        mamba_norm_first=r.flag("mamba_rms_norm") and r.flag("mamba_norm_before_gate", True),
        embed_multiplier=m["embedding_multiplier"] if m["embedding_multiplier"] != 1.0 else 0.0,
        logits_scaling=1.0 / m["lm_head_multiplier"] if m["lm_head_multiplier"] != 1.0 else 0.0)
    # the per-layer multipliers, placed by ``_edit``
    r.arch["layer_scales"] = tuple((k, v) for k, v in m.items() if k not in ("lm_head_multiplier",
                                                                             "embedding_multiplier"))


_RENAME = (("post_attention_layernorm.", "pre_ff_layernorm."), ("mlp.", "feed_forward."),
           ("model.norm.", "model.final_layernorm."))


def _hf(name: str) -> str:
    for a, b in _RENAME:
        if name.startswith(a):
            return b + name[len(a):]
    return name


def _edit(cfg, sh, ops: list) -> list:
    """Falcon-H1's own ops: the sum of the two mixers' outputs (a residual-kind add) before the residual, the
    multipliers that are not 1 where they run (module docstring), and its tensor names."""
    scales = dict(cfg.layer_scales)
    H, every = cfg.hidden, tuple(range(cfg.n_layers))
    L = len(every)
    inner = cfg.mamba_heads * cfg.mamba_head_dim
    gn = cfg.mamba_groups * cfg.mamba_state
    widths = dict(zip(("z", "x", "B", "C", "dt"), (inner, inner, gn, gn, cfg.mamba_heads)))

    def scale(name, width, factor, group="attention"):
        return OpSpec(name, "scale", "layer", group, L, (), {"width": width, "factor": factor}, every)

    before, after = {}, {}
    if scales["ssm_in_multiplier"] != 1.0:
        before["in_proj"] = [scale("ssm_in_scale", H, scales["ssm_in_multiplier"])]
    mup = scales["ssm_multipliers"]
    if any(x != 1.0 for x in mup):      # the mup vector over in_proj's z, x, B, C, dt: one multiply per output
        after["in_proj"] = [scale("ssm_mup_scale", sum(widths.values()), mup)]
    if scales["ssm_out_multiplier"] != 1.0:
        after["out_proj"] = [scale("ssm_out_scale", H, scales["ssm_out_multiplier"])]
    if scales["attention_in_multiplier"] != 1.0:
        before["q_proj"] = [scale("attn_in_scale", H, scales["attention_in_multiplier"])]
    if scales["key_multiplier"] != 1.0:
        after["k_proj"] = [scale("key_scale", sh.kv_dim, scales["key_multiplier"])]
    if scales["attention_out_multiplier"] != 1.0:
        after["o_proj"] = [scale("attn_out_scale", H, scales["attention_out_multiplier"])]
    gate, down = scales["mlp_multipliers"]
    if gate != 1.0:
        after["gate_proj"] = [scale("mlp_gate_scale", sh.intermediate, gate, "mlp")]
    if down != 1.0:
        after["down_proj"] = [scale("mlp_down_scale", H, down, "mlp")]
    before["attn_residual"] = [OpSpec("mixer_sum", "residual", "layer", "residual", L, (), {"width": H}, every)]
    out = []
    for o in ops:
        out += before.get(o.name, [])
        out.append(replace(o, weights=tuple(replace(w, hf=_hf(w.hf)) for w in o.weights)))
        out += after.get(o.name, [])
    return out


register(Family("falcon_h1", read_falcon_h1, keys=FALCON_H1_KEYS, edit_ops=_edit))
