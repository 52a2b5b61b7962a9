"""The layer as data: a model config's ops, each described once, in the order they run.

``model_ops(cfg, sh)`` lists every op of a step for the config ``cfg`` at one rank's sizes ``sh``
(``roofline.parallel.shard``): the parts before the layers (embedding, its scale), the per-layer ops and
the parts after (final norm, lm_head, the logits' softcap). Each ``OpSpec`` says its name, its kind
(what formula costs it and what kernel runs it), its colour group in the reports, how many instances a
step runs (layers with different attention windows are separate ops: ``attention``,
``attention_sliding`` and ``attention_chunked``), its sizes, and the weights it reads (``WeightSpec``: our key, shape and layout,
the Hugging Face tensor it loads from, how it shards under --tp). The tensor names are Llama's unless the
config's family says otherwise (``roofline.families`` ``Tensors``: fused projections, MoE names,
interleaved experts); nothing here names a ``model_type``.

Everything that used to list the Llama layer by hand loops over this list instead: the workload's costs
(``roofline.workload``), parameter and weight-byte counts and the memory estimate, weight
initialisation, sharding and checkpoint loading (``kernels``), the runners, the compile check's
variants, the analysis's op counts and the reports' colours and legend order.

Kinds: embedding, scale (an elementwise multiply), norm (RMSNorm over ``width`` features, ``rows``
rows per token), linear (``in_features`` -> ``out_features``, ``bias``), rope, kv_append, attention
(``window`` keys, 0 for full; ``chunk`` positions, 0 for none; ``softcap``), residual, activation (``fn`` silu,
gelu_tanh or relu2), softcap; Gated DeltaNet's conv1d, delta_gates, gated_delta, gated_norm, and sigmoid_gate (the
gated attention's output: ``roofline.ops.deltanet``); DeepSeek Sparse Attention's layernorm, index_append,
index_scores and index_topk (``roofline.ops.dsa``); Mamba-2's ssd_scan (``roofline.ops.mamba``; its conv1d and
gated_norm are DeltaNet's).

Layers: each has a mixer (attention, DeltaNet, Mamba-2, or both attention and Mamba-2: layer_types "hybrid") with
its norm and residual, and an MLP (dense or routed) with its norm and residual; Nemotron-H's blocks keep one of
the two (``ModelConfig.mixer_layers``: all but layer_types "mlp"; ``mlp_layers``: all but ``no_mlp_layers``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from .errors import RooflineError
from .families import edit_ops, tensors
from .formulas import DELTA_CHUNK, UNGATED
from .models import PRESETS, ModelConfig
from .op_spec import OpSpec, WeightSpec
from .parallel import Shard, shard
from .precision import MODULES, Precision, resolve
from .precision.modules import WEIGHT_ROLES

GATED = ("silu", "gelu_tanh")            # the MLP activations with a gate_proj (relu2 has none)
LAYER_OP = "layer"                       # one whole transformer layer timed as one op


def _linear(name, group, k, n, key, hf, shard_w, count, layers, bias=False, bias_key=None, bias_hf=None,
            bias_shard=None, part=(), module="mlp", rope=()):
    ws = [WeightSpec(key, (k, n), "linear", hf, shard_w, part, rope=rope)]
    if bias:
        ws.append(WeightSpec(bias_key, (n,), "bias", bias_hf, bias_shard, part, rope=rope))
    return OpSpec(name, "linear", "layer", group, count, tuple(ws),
                  {"in_features": k, "out_features": n, "bias": bias}, layers, module)


def _norm(name, key, hf, width, count, layers, offset, group="norm", rows=1, part="layer"):
    return OpSpec(name, "norm", part, group, count, (WeightSpec(key, (width,), "norm", hf, "replicated",
                                                                 offset=offset),),
                  {"width": width, "rows": rows}, layers, "norm")


def model_ops(cfg: ModelConfig, sh: Shard | None = None) -> tuple:
    """Every op of one step of ``cfg`` (one rank's sizes under ``sh``), in the order they run."""
    return _model_ops(cfg, sh or shard(cfg, 1))


@lru_cache(maxsize=64)
def _model_ops(cfg: ModelConfig, sh: Shard) -> tuple:
    L, H = cfg.n_layers, cfg.hidden
    every = tuple(range(L))
    ops = [OpSpec("embedding", "embedding", "pre", "embed", 1,
                  (WeightSpec("embed", (sh.vocab, H), "embedding", "model.embed_tokens.weight", "vocab"),),
                  {"vocab": sh.vocab, "hidden": H}, module="embedding")]
    if cfg.embed_scale or cfg.embed_multiplier:    # Gemma's sqrt(hidden), Granite's embedding_multiplier
        ops.append(OpSpec("embed_scale", "scale", "pre", "embed", 1, (), {
            "width": H, "factor": cfg.embed_multiplier if cfg.embed_multiplier else H ** 0.5}))
    mixed, mlps = cfg.mixer_layers, cfg.mlp_layers     # every layer, but Nemotron-H's blocks hold one of the two
    if cfg.pre_norms:                  # OLMo-2 has none: its norms come after attention and the MLP
        ops.append(_norm("attn_norm", "attn_norm", "input_layernorm.weight", H, len(mixed), mixed, cfg.norm_offset))
    ops += _mla_ops(cfg, sh) if cfg.mla else _attention_ops(cfg, sh)
    if cfg.linear_layers:               # Gated DeltaNet on the others (Qwen3-Next, Qwen3.5)
        ops += _deltanet_ops(cfg, sh)
    if cfg.mamba_layers:                # Mamba-2 on the others (Nemotron-H, Granite-4.0-H)
        ops += _mamba_ops(cfg, sh)
    if cfg.sandwich_norms:
        ops.append(_norm("post_attn_norm", "post_attn_norm", "post_attention_layernorm.weight", H, L, every,
                         cfg.norm_offset))
    res = {"width": H, **({"scale": cfg.residual_multiplier} if cfg.residual_multiplier else {})}   # x + m * branch
    ops.append(OpSpec("attn_residual", "residual", "layer", "residual", len(mixed), (), res, mixed))
    if cfg.pre_norms and mlps:
        ops.append(_norm("mlp_norm", "mlp_norm", "pre_feedforward_layernorm.weight" if cfg.sandwich_norms
                         else "post_attention_layernorm.weight", H, len(mlps), mlps, cfg.norm_offset))
    moe = cfg.moe_layers
    dense = tuple(i for i in mlps if i not in moe)
    if dense:
        ops += _dense_mlp_ops(cfg, sh, dense, I=sh.intermediate if not moe else _dense_width(cfg, sh))
    if moe:
        ops += _moe_ops(cfg, sh, moe)
    if cfg.sandwich_norms:
        ops.append(_norm("post_mlp_norm", "post_mlp_norm", "post_feedforward_layernorm.weight", H, L, every,
                         cfg.norm_offset))
    if mlps:
        ops.append(OpSpec("mlp_residual", "residual", "layer", "residual", len(mlps), (), res, mlps))
    ops.append(_norm("final_norm", "final_norm", "model.norm.weight", H, 1, (), cfg.norm_offset, part="post"))
    head_w = () if cfg.tie_embeddings else (WeightSpec("lm_head", (H, sh.vocab), "linear", "lm_head.weight", "vocab"),)
    ops.append(OpSpec("lm_head", "linear", "post", "head", 1, head_w,
                      {"in_features": H, "out_features": sh.vocab, "bias": False, "tied": cfg.tie_embeddings},
                      module="lm_head"))
    if cfg.logits_scaling:
        ops.append(OpSpec("logits_scale", "scale", "post", "head", 1, (), {"width": sh.vocab,
                                                                          "factor": 1 / cfg.logits_scaling}))
    if cfg.final_softcap:
        ops.append(OpSpec("final_softcap", "softcap", "post", "head", 1, (), {"width": sh.vocab,
                                                                             "cap": cfg.final_softcap}))
    edit = edit_ops(cfg.arch)          # a family's own ops (a new kind), placed where they run
    return tuple(edit(cfg, sh, ops) if edit is not None else ops)


def _dense_width(cfg: ModelConfig, sh: Shard) -> int:
    """A dense layer's MLP width in an MoE model (DeepSeek's first layers: intermediate_size), per rank."""
    return cfg.intermediate // sh.tp


def _attention_ops(cfg: ModelConfig, sh: Shard) -> list:
    """The attention of every layer that has one (all but Gated DeltaNet's: ``ModelConfig.attention_layers``)."""
    every = cfg.attention_layers
    L, H, D = len(every), cfg.hidden, cfg.head_dim
    Hq, Hkv, qd, kvd = sh.n_heads, sh.n_kv_heads, sh.q_dim, sh.kv_dim
    fused = tensors(cfg.arch).fused_qkv
    ops = []
    if not every:
        return ops

    def proj(name, k, n, key, shard_w, hf, part=(), bias=False, bkey=None, bshard=None):
        rope = (D, 0, D) if cfg.rope_interleave and name in ("q_proj", "k_proj") else ()   # ERNIE's pairs
        return _linear(name, "attention", k, n, key, hf if not part else part[0], shard_w, L, every, bias, bkey,
                       (hf.replace(".weight", ".bias") if not part else part[0].replace(".weight", ".bias")),
                       bshard, part[1:] if part else (), "attention", rope)

    qkv = "self_attn.qkv_proj.weight"
    sizes = (cfg.q_dim, cfg.kv_dim, cfg.kv_dim)
    qn = 2 * qd if cfg.attn_gate else qd      # gated attention: each head's q then its gate (Qwen3-Next)
    for i, (name, key, n, sh_w, b) in enumerate((("q_proj", "wq", qn, "q_cols", "bq"), ("k_proj", "wk", kvd, "kv_cols",
                                                                                     "bk"),
                                                 ("v_proj", "wv", kvd, "kv_cols", "bv"))):
        ops.append(proj(name, H, n, key, sh_w, f"self_attn.{name}.weight", (qkv, i, sizes) if fused else (),
                        cfg.qkv_bias, b, sh_w))
    if cfg.qk_norm and cfg.qk_norm_whole:     # OLMo-2: over the whole projection (one row per token)
        ops.append(_norm("q_norm", "q_norm", "self_attn.q_norm.weight", qd, L, every, cfg.norm_offset, "attention"))
        ops.append(_norm("k_norm", "k_norm", "self_attn.k_norm.weight", kvd, L, every, cfg.norm_offset, "attention"))
    elif cfg.qk_norm:
        ops.append(_norm("q_norm", "q_norm", "self_attn.q_norm.weight", D, L, every, cfg.norm_offset, "attention",
                         rows=Hq))
        ops.append(_norm("k_norm", "k_norm", "self_attn.k_norm.weight", D, L, every, cfg.norm_offset, "attention",
                         rows=Hkv))
    roped = tuple(i for i in every if i not in cfg.nope_layers)        # NoPE layers rotate nothing
    if roped:
        ops.append(OpSpec("rope", "rope", "layer", "attention", len(roped), (), {   # partial rotary: its dims only
            "n_heads": Hq, "n_kv_heads": Hkv, "head_dim": cfg.rotary_dim or D}, roped))
    if cfg.qk_l2_norm and roped:      # Llama-4: x / rms(x) over each head's q and k after RoPE, no weight
        ops.append(OpSpec("q_norm", "norm", "layer", "attention", len(roped), (), {"width": D, "rows": Hq}, roped,
                          "norm"))
        ops.append(OpSpec("k_norm", "norm", "layer", "attention", len(roped), (), {"width": D, "rows": Hkv}, roped,
                          "norm"))
    if cfg.attn_temperature and cfg.nope_layers:   # Llama-4: NoPE layers' queries x a factor of their position
        floor, scale = cfg.attn_temperature
        ops.append(OpSpec("attn_temperature", "scale", "layer", "attention", len(cfg.nope_layers), (), {
            "width": qd, "factor": 1.0, "floor_scale": floor, "attn_scale": scale}, cfg.nope_layers))   # per position
    ops.append(OpSpec("kv_append", "kv_append", "layer", "attention", L, (), {"n_kv_heads": Hkv, "head_dim": D},
                      every))
    windows, chunks = cfg.windows, cfg.chunks
    sinks = (WeightSpec("sinks", (Hq,), "vector", "self_attn.sinks", "q_heads"),) if cfg.attn_sinks else ()
    kinds = {i: "sliding" if windows[i] else "chunked" if chunks[i] else "full" for i in every}   # attention layers
    for name, want in (("attention", "full"), ("attention_sliding", "sliding"), ("attention_chunked", "chunked")):
        idx = tuple(i for i in every if kinds[i] == want)
        if not idx:
            continue
        if len(idx) == L:   # every layer slides (Mistral, Phi-3) or is chunked: one attention op, with its window
            name = "attention"
        ops.append(OpSpec(name, "attention", "layer", "attention", len(idx), sinks,
                          {"n_heads": Hq, "n_kv_heads": Hkv, "head_dim": D, "window": windows[idx[0]],
                           "chunk": chunks[idx[0]], "softcap": cfg.attn_softcap, "scale": cfg.scale,
                           "sinks": cfg.attn_sinks, "rope_theta": (cfg.rope_local_theta or cfg.rope_theta)
                           if want == "sliding" else cfg.rope_theta}, idx, "attention"))
    if cfg.attn_gate:
        ops.append(OpSpec("attn_output_gate", "sigmoid_gate", "layer", "attention", L, (), {"width": qd}, every))
    ops.append(proj("o_proj", qd, H, "wo", "q_rows", "self_attn.o_proj.weight", bias=cfg.o_bias, bkey="bo",
                    bshard="rank0"))
    return ops


def _deltanet_ops(cfg: ModelConfig, sh: Shard) -> list:
    """Gated DeltaNet (``ModelConfig.linear_layers``): the input projections of q, k, v, the output gate z and the
    gates b, a (fused as the family's checkpoint keeps them: ``Tensors.deltanet``), the causal conv1d over q, k, v,
    beta and the decay g (A_log, dt_bias), the gated delta rule (chunked prefill, recurrent decode), the gated
    RMSNorm of each value head's output by z, and out_proj. ``roofline.formulas.deltanet`` costs them."""
    every = cfg.linear_layers
    L, H = len(every), cfg.hidden
    Hk, Hv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
    width = {"q": Hk * dk, "k": Hk * dk, "v": Hv * dv, "z": Hv * dv, "b": Hv, "a": Hv}
    pre = "linear_attn."
    ops = [_linear(name, "attention", H, sum(width[c] for c in outs), "w_" + name, f"{pre}{name}.weight",
                   "replicated", L, every, module="attention") for name, outs in tensors(cfg.arch).deltanet]
    channels = 2 * Hk * dk + Hv * dv
    ops.append(OpSpec("conv1d", "conv1d", "layer", "attention", L,
                      (WeightSpec("w_conv", (channels, cfg.linear_conv), "vector", f"{pre}conv1d.weight"),),
                      {"channels": channels, "kernel": cfg.linear_conv}, every))
    ops.append(OpSpec("delta_gates", "delta_gates", "layer", "attention", L,
                      (WeightSpec("a_log", (Hv,), "vector", f"{pre}A_log"),
                       WeightSpec("dt_bias", (Hv,), "vector", f"{pre}dt_bias")), {"v_heads": Hv}, every))
    ops.append(OpSpec("gated_delta", "gated_delta", "layer", "attention", L, (),
                      {"k_heads": Hk, "v_heads": Hv, "k_dim": dk, "v_dim": dv, "chunk": DELTA_CHUNK}, every))
    ops.append(OpSpec("gated_norm", "gated_norm", "layer", "norm", L,
                      (WeightSpec("w_gnorm", (dv,), "norm", f"{pre}norm.weight"),), {"width": dv, "rows": Hv},
                      every, "norm"))
    ops.append(_linear("out_proj", "attention", Hv * dv, H, "w_out", f"{pre}out_proj.weight", "replicated", L, every,
                       module="attention"))
    return ops


def _mamba_ops(cfg: ModelConfig, sh: Shard) -> list:
    """Mamba-2 (``ModelConfig.mamba_layers``): in_proj to z, x, B, C and dt (one tensor), the causal conv1d (and
    its bias) over x, B, C with SiLU, the SSD scan (chunked prefill by the config's chunk_size, recurrent decode)
    reading A_log, dt_bias and D, the gated RMSNorm of y x silu(z) in mamba_groups groups (one weight over the
    inner width), and out_proj. ``roofline.formulas.mamba`` costs the scan."""
    every = cfg.mamba_layers
    L, H = len(every), cfg.hidden
    h, p, n, G = cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_state, cfg.mamba_groups
    inner, channels = h * p, h * p + 2 * G * n
    pre, bias = "mamba.", cfg.mamba_proj_bias
    ops = [_linear("in_proj", "attention", H, inner + channels + h, "w_in_proj", f"{pre}in_proj.weight", "replicated",
                   L, every, bias, "b_in_proj", f"{pre}in_proj.bias", "replicated", module="attention")]
    conv_ws = (WeightSpec("w_conv", (channels, cfg.mamba_conv), "vector", f"{pre}conv1d.weight"),)
    if cfg.mamba_conv_bias:
        conv_ws += (WeightSpec("b_conv", (channels,), "bias", f"{pre}conv1d.bias"),)
    ops.append(OpSpec("conv1d", "conv1d", "layer", "attention", L, conv_ws,
                      {"channels": channels, "kernel": cfg.mamba_conv, "bias": cfg.mamba_conv_bias}, every))
    ops.append(OpSpec("ssd_scan", "ssd_scan", "layer", "attention", L,
                      tuple(WeightSpec(k, (h,), "vector", f"{pre}{k}") for k in ("A_log", "dt_bias", "D")),
                      {"heads": h, "head_dim": p, "state": n, "groups": G, "chunk": cfg.mamba_chunk}, every))
    if cfg.mamba_norm:
        ops.append(OpSpec("gated_norm", "gated_norm", "layer", "norm", L,
                          (WeightSpec("w_gnorm", (inner,), "norm", f"{pre}norm.weight"),),
                          {"width": inner, "rows": 1, "groups": G}, every, "norm"))
    else:                               # y x silu(z): SwiGLU's cost (Falcon-H1 without mamba_rms_norm)
        ops.append(OpSpec("ssm_gate", "activation", "layer", "attention", L, (), {"width": inner, "fn": "silu"},
                          every))
    ops.append(_linear("out_proj", "attention", inner, H, "w_out", f"{pre}out_proj.weight", "replicated", L, every,
                       bias, "b_out_proj", f"{pre}out_proj.bias", "replicated", module="attention"))
    return ops


def _mla_ops(cfg: ModelConfig, sh: Shard) -> list:
    """DeepSeek's multi-head latent attention. The cache holds the latent c_kv (kv_lora_rank) and the shared
    rope key (qk_rope_dim) per token. Prefill runs it naive (kv_b_proj up-projects every key to per-head
    K and V); decode absorbed (W_UK folded into the query, W_UV into the output: ``mla_up``)."""
    L, H = cfg.n_layers, cfg.hidden
    every = tuple(range(L))
    Hq, R, P, N, V = sh.n_heads, cfg.kv_lora_rank, cfg.qk_rope_dim, cfg.qk_nope_dim, cfg.v_head_dim
    perm = (N + P, N, P) if cfg.rope_interleave else ()
    lin = lambda name, k, n, key, hf, shard_w, rope=(): OpSpec(  # noqa: E731
        name, "linear", "layer", "attention", L, (WeightSpec(key, (k, n), "linear", hf, shard_w, rope=rope),),
        {"in_features": k, "out_features": n, "bias": False}, every, "mla")
    ops = []
    if cfg.q_lora_rank:
        ops.append(lin("q_a_proj", H, cfg.q_lora_rank, "wq_a", "self_attn.q_a_proj.weight", "replicated"))
        ops.append(_norm("q_a_norm", "q_a_norm", "self_attn.q_a_layernorm.weight", cfg.q_lora_rank, L, every,
                         cfg.norm_offset, "attention"))
        ops.append(lin("q_b_proj", cfg.q_lora_rank, Hq * (N + P), "wq_b", "self_attn.q_b_proj.weight", "mla_q_cols",
                       perm))
    else:
        ops.append(lin("q_proj", H, Hq * (N + P), "wq", "self_attn.q_proj.weight", "mla_q_cols", perm))
    ops.append(lin("kv_a_proj", H, R + P, "wkv_a", "self_attn.kv_a_proj_with_mqa.weight", "replicated",
                   (R + P, R, P) if cfg.rope_interleave else ()))
    ops.append(_norm("kv_a_norm", "kv_a_norm", "self_attn.kv_a_layernorm.weight", R, L, every, cfg.norm_offset,
                     "attention"))
    ops.append(OpSpec("rope", "rope", "layer", "attention", L, (), {"n_heads": Hq, "n_kv_heads": 1,
                                                                    "head_dim": P}, every))
    ops.append(OpSpec("kv_append", "latent_append", "layer", "attention", L, (), {"width": R + P}, every))
    ops.append(OpSpec("kv_b_proj", "mla_up", "layer", "attention", L,
                      (WeightSpec("wkv_b", (R, Hq * (N + V)), "linear", "self_attn.kv_b_proj.weight", "mla_kv_cols"),),
                      {"n_heads": Hq, "rank": R, "nope": N, "v": V}, every, "mla"))
    if cfg.index_topk:
        ops += _indexer_ops(cfg)
    sparse = {"topk": cfg.index_topk} if cfg.index_topk else {}
    ops.append(OpSpec("attention", "mla_attention", "layer", "attention", L, (),
                      {"n_heads": Hq, "rank": R, "rope": P, "nope": N, "v": V, "scale": cfg.scale, **sparse}, every))
    ops.append(lin("o_proj", Hq * V, H, "wo", "self_attn.o_proj.weight", "mla_o_rows"))
    return ops


def _indexer_ops(cfg: ModelConfig) -> list:
    """DeepSeek Sparse Attention's lightning indexer (``ModelConfig.index_layers``: GLM-5's shared layers reuse
    the previous indexer's selection and run none): wq_b from the q latent, wk and its LayerNorm (the one key of
    a token), RoPE on the first qk_rope_dim of each, the key written to its fp8 cache, weights_proj (a weight per
    head), every query's scores over every key up to its own, and the top-k selection MLA attends to
    (``roofline.formulas.dsa``). Replicated: every rank runs the whole indexer."""
    every = cfg.index_layers
    L, H, Hi, Di = len(every), cfg.hidden, cfg.index_n_heads, cfg.index_head_dim
    pre = "self_attn.indexer."

    # GLM-5 rotates the indexer's rope dims as interleaved pairs: q's, k's (and k_norm's) rows loaded de-interleaved
    perm = (Di, 0, cfg.qk_rope_dim) if cfg.index_rope_interleave else ()

    def lin(name, k, n, key, hf, rope=()):
        return _linear(name, "attention", k, n, key, f"{pre}{hf}.weight", "replicated", L, every, module="mla",
                       rope=rope)

    return [
        lin("index_wq_b", cfg.q_lora_rank, Hi * Di, "wi_q", "wq_b", perm),
        lin("index_wk", H, Di, "wi_k", "wk", perm),
        OpSpec("index_k_norm", "layernorm", "layer", "attention", L,
               (WeightSpec("wi_knorm", (Di,), "norm", f"{pre}k_norm.weight", rope=perm),
                WeightSpec("bi_knorm", (Di,), "bias", f"{pre}k_norm.bias", rope=perm)), {"width": Di, "rows": 1},
               every, "norm"),
        OpSpec("index_rope", "rope", "layer", "attention", L, (),
               {"n_heads": Hi, "n_kv_heads": 1, "head_dim": cfg.qk_rope_dim}, every),
        OpSpec("index_append", "index_append", "layer", "attention", L, (), {"head_dim": Di}, every),
        lin("index_weights", H, Hi, "wi_w", "weights_proj"),
        OpSpec("index_scores", "index_scores", "layer", "attention", L, (), {"n_heads": Hi, "head_dim": Di}, every),
        OpSpec("index_topk", "index_topk", "layer", "attention", L, (), {"topk": cfg.index_topk}, every),
    ]


def _dense_mlp_ops(cfg: ModelConfig, sh: Shard, layers: tuple, I: int) -> list:
    H, n = cfg.hidden, len(layers)
    fused = tensors(cfg.arch).fused_gate_up
    pre = tensors(cfg.arch).mlp                  # mlp. (Llama-4: feed_forward.)
    gu = "mlp.gate_up_proj.weight"
    ops = []
    for name, key, k, m, sh_w, b in (("gate_proj", "w_gate", H, I, "i_cols", "b_gate"), ("up_proj", "w_up", H, I,
                                                                                       "i_cols", "b_up")):
        if name == "gate_proj" and cfg.activation not in GATED:     # relu2: up -> relu2 -> down (Nemotron-H)
            continue
        part = (gu, 0 if name == "gate_proj" else 1, (cfg.intermediate,) * 2) if fused else ()
        hf = part[0] if part else f"{pre}{name}.weight"
        ops.append(_linear(name, "mlp", k, m, key, hf, sh_w, n, layers, cfg.mlp_bias, b,
                           hf.replace(".weight", ".bias"), sh_w, part[1:] if part else ()))
    act = {"silu": "swiglu", "gelu_tanh": "geglu"}.get(cfg.activation, cfg.activation)
    ops.append(OpSpec(act, "activation", "layer", "mlp", n, (), {"width": I, "fn": cfg.activation}, layers))
    ops.append(_linear("down_proj", "mlp", I, H, "w_down", f"{pre}down_proj.weight", "i_rows", n, layers,
                       cfg.mlp_bias, "b_down", f"{pre}down_proj.bias", "rank0"))
    return ops


def _moe_ops(cfg: ModelConfig, sh: Shard, layers: tuple) -> list:
    """The MoE MLP: the router (a [H, E] GEMM and the top-k), the routed experts as one grouped GEMM (the
    weight bytes of the distinct experts a step touches: roofline.workload), and the shared expert(s)."""
    H, E, k, n = cfg.hidden, cfg.n_experts, cfg.n_active, len(layers)
    # this rank's experts (all E, or E / ep whole ones under expert parallelism) and their width (sliced by tp,
    # whole under ep): roofline.parallel.shard
    E_rank, I = (sh.n_experts, sh.moe_intermediate) if sh.n_experts else (E, cfg.moe_intermediate // sh.tp)
    cols, rows_ = ("e_whole", "e_whole") if sh.ep > 1 else ("e_cols", "e_rows")
    layout = tensors(cfg.arch)             # where the family keeps them (roofline.families: Tensors.moe)
    names = layout.moe
    r_ws = [WeightSpec("router", (H, E), "linear", names["router"], "replicated")]
    if cfg.router_bias:
        r_ws.append(WeightSpec("router_bias", (E,), "bias", names["router_bias"], "replicated"))
    if cfg.router_correction:
        r_ws.append(WeightSpec("router_correction", (E,), "vector", names["correction"], "replicated"))
    ops = [OpSpec("router", "router", "layer", "mlp", n, tuple(r_ws),
                  {"n_experts": E, "k": k, "kind": cfg.router, "in_features": H, "renorm": cfg.norm_topk,
                   "routed_input": cfg.routed_input,
                   "n_group": cfg.n_group, "topk_group": cfg.topk_group, "scale": cfg.routed_scale}, layers,
                  "router")]
    inter = layout.interleaved_gate_up     # gate = [..., 0::2], up = [..., 1::2] of gate_up_proj
    halves = (cfg.moe_intermediate,) * 2 if layout.halved_gate_up else ()   # gate = [..., :I], up = [..., I:]
    o_i = layout.experts_out_in
    e_ws = [WeightSpec("experts_gate", (E_rank, H, I), "experts", names["gate"], cols,
                       ("interleave", 0) if inter else (0, halves) if halves else (), out_in=o_i),
            WeightSpec("experts_up", (E_rank, H, I), "experts", names["up"], cols,
                       ("interleave", 1) if inter else (1, halves) if halves else (), out_in=o_i),
            WeightSpec("experts_down", (E_rank, I, H), "experts", names["down"], rows_, out_in=o_i)]
    if cfg.expert_activation in UNGATED:       # up -> relu2 -> down: no gate (Nemotron-H)
        e_ws = e_ws[1:]
    if cfg.expert_bias:
        e_ws += [WeightSpec("experts_gate_bias", (E_rank, I), "expert_bias", names["gate_bias"], cols,
                            ("interleave", 0)),
                 WeightSpec("experts_up_bias", (E_rank, I), "expert_bias", names["up_bias"], cols, ("interleave", 1)),
                 WeightSpec("experts_down_bias", (E_rank, H), "expert_bias", names["down_bias"],
                            "e_whole" if sh.ep > 1 else "rank0")]
    ops.append(OpSpec("experts", "experts", "layer", "mlp", n, tuple(e_ws),
                      {"n_experts": E, "k": k, "hidden": H, "intermediate": I, "activation": cfg.expert_activation,
                       "bias": cfg.expert_bias, "ep": sh.ep, "rank_experts": E_rank}, layers, "experts"))
    S = cfg.shared_intermediate // sh.tp
    if S:
        pre = names["shared"]
        ungated = cfg.expert_activation in UNGATED      # Nemotron-H's shared expert: up -> relu2 -> down
        for name, key, a, b, sh_w in (("shared_gate_proj", "ws_gate", H, S, "i_cols"),
                                      ("shared_up_proj", "ws_up", H, S, "i_cols"))[1 if ungated else 0:]:
            ops.append(_linear(name, "mlp", a, b, key, pre + name.replace("shared_", "") + ".weight", sh_w, n, layers,
                               module="shared_experts"))
        fn = cfg.expert_activation if ungated else "silu"
        ops.append(OpSpec("shared_relu2" if ungated else "shared_swiglu", "activation", "layer", "mlp", n, (),
                          {"width": S, "fn": fn}, layers))
        ops.append(_linear("shared_down_proj", "mlp", S, H, "ws_down", pre + "down_proj.weight", "i_rows", n, layers,
                           module="shared_experts"))
        if cfg.shared_gate:
            ops.append(OpSpec("shared_expert_gate", "gate", "layer", "mlp", n,
                              (WeightSpec("ws_gate_vec", (H, 1), "linear", names["shared_gate"], "replicated"),),
                              {"in_features": H, "width": H}, layers, "router"))
    return ops


# layer_types kinds with formulas and no kernels yet: what the run paths refuse (kind -> what it is, for the refusal).
# Empty: every kind runs (Gated DeltaNet's "linear", Mamba-2's "mamba", Falcon-H1's "hybrid", Nemotron-H's "mlp").
NOT_RUN: dict = {}


def check_runnable(cfg: ModelConfig) -> None:
    """A one-line RooflineError for a model with a layer kind of ``NOT_RUN`` (formulas, no kernels in the model
    yet): what builds or times a model (``kernels``, ``profile``) calls it before anything runs."""
    kinds = [t for t in dict.fromkeys(cfg.layer_types) if t in NOT_RUN]
    if kinds:
        raise RooflineError(f"{cfg.name}: {NOT_RUN[kinds[0]]} layers are costed but not run yet: roofline explain "
                            "and the cost commands take this model; profile, latency, serve and check do not.")
    # Gated DeltaNet, Mamba-2 (alone, beside attention, Nemotron-H's mixer-only and MLP-only blocks, relu2 MLPs and
    # experts) and DeepSeek Sparse Attention run (kernels.deltanet, kernels.mamba, kernels.relu2, kernels.dsa)


@lru_cache(maxsize=64)
def precision_of(cfg: ModelConfig) -> Precision:
    """The checkpoint's own precision of ``cfg`` (its ``quantization``, matched against every op's Hugging Face
    names: ``roofline.precision.checkpoint.resolve``); a float model's is empty (everything in the activation
    dtype)."""
    return resolve(cfg.quantization, model_ops(cfg))


def module_classes(cfg: ModelConfig) -> tuple:
    """The module classes whose weights ``cfg``'s ops read, in ``MODULES``' order (what ``explain`` lists)."""
    have = {o.module for o in model_ops(cfg) if any(w.role in WEIGHT_ROLES for w in o.weights)}
    return tuple(m for m in MODULES if m in have)


def op_names(cfg: ModelConfig) -> tuple:
    """The op names of ``cfg``'s step, in the order they run."""
    return tuple(o.name for o in model_ops(cfg))


def op_spec(cfg: ModelConfig, name: str) -> OpSpec:
    for o in model_ops(cfg):
        if o.name == name:
            return o
    raise KeyError(name)


def weight_elements(cfg: ModelConfig, sh: Shard | None = None, *, roles=None):
    """Elements of every weight the step reads (per-layer weights times their layer count), by ``roles``."""
    total = 0
    for o in model_ops(cfg, sh):
        for w in o.weights:
            if roles is None or w.role in roles:
                n = 1
                for s in w.shape:
                    n *= s
                total += n * (o.count if o.per_layer else 1)
    return total


def model_params(cfg: ModelConfig) -> int:
    """Parameter count: every weight, the per-layer ones once per layer; a tied lm_head is the embedding."""
    return int(weight_elements(cfg))


def op_order(models=None) -> tuple:
    """Every op name the given configs (default: every preset) can have, merged in the order they run: a
    name one config adds comes right after the op it follows there. Reports order legends and colours by it."""
    if models is None:
        models = PRESETS.values()
    order: list = []
    for m in models:
        prev = None
        for name in (o.name for o in model_ops(m)):
            if name not in order:
                order.insert(order.index(prev) + 1 if prev is not None else 0, name)
            prev = name
    return tuple(order)
