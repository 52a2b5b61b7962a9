"""A Llama-style transformer assembled from our kernels, with a preallocated slot KV cache.

    from kernels.model import LlamaModel
    m = LlamaModel(load_model("tiny"), dtype="fp32", backend="triton")
    logits = m.prefill(torch.tensor([1, 2, 3]), slot=0)       # [vocab] fp32, last position
    nxt = m.greedy(logits)
    logits = m.decode_step(nxt[None], torch.tensor([0]))     # [1, vocab]

KV cache: k_cache, v_cache [n_layers, max_slots, Hkv, max_len, D]; a slot holds one sequence
and ``lengths[slot]`` tokens of it (``lengths`` lives on the host, so no call syncs the
device to learn it). ``prefill`` appends a chunk after the slot's length (repeated calls =
chunked prefill; after ``copy_prefix`` = prefix reuse). ``decode_step`` adds one token to
each of several slots of different lengths. Weights are random from a seed (no checkpoint
is loaded): enough to time and validate kernels, and logits are deterministic.
Layers: the ops of ``roofline.layer.model_ops(cfg)`` in its order (a Llama's: attn_norm, q/k/v_proj, rope,
kv_append, attention, o_proj, residual, mlp_norm, gate/up_proj, swiglu, down_proj, residual; Qwen's biases
and qk-norm, sliding windows, Gemma's GeGLU, embedding scale, four norms and softcaps where the config
has them). Weights load from a checkpoint folder with ``kernels.checkpoint.load_weights``; a quantized checkpoint's
weights stay in its format where this backend runs it, else are dequantized at load: ``notes`` says which.
Gated DeltaNet layers (Qwen3-Next, Qwen3.5: layer_types "linear", ``deltanet_mixer``) keep a state cache beside the
KV cache: per linear layer and slot, the conv state [C, kernel - 1] and the recurrent state [Hv, dk, dv] fp32, at the
slot's end (a prefill from length 0 starts from zeros; a chunk after cached tokens continues from them); prefix reuse
copies a source's states only when the whole source is reused, and refuses a shorter prefix in one line.
Mamba-2 layers (Nemotron-H, Granite-4.0-H: layer_types "mamba"; Falcon-H1's "hybrid", beside attention; ``mamba_mixer``)
keep theirs the same way: per Mamba layer and slot, the conv state [C, kernel - 1] (activation dtype) and the SSM state
[H, P, N] fp32 (``mamba_conv``, ``ssm_state``).
Tensor parallelism: ``LlamaModel(..., tp=kernels.tp.TPGroup(rank, world))`` inside an initialised
torch.distributed group holds this rank's shard of the same seeded weights (``kernels.tp``); its
logits equal the single-device model's.
Precision (``kernels.run_precision``): a quantized checkpoint's modules run in its own formats (``precision``
says each, ``notes`` where ours differ); ``weight_dtype`` overrides it: a registered format ("int8" per output
channel, "int4" with ``group_size`` 128 by default, 32/64 allowed, ``zero_point`` optional, "fp8", "fp8-block",
"mxfp4", "nvfp4") for every linear, the routed experts and lm_head, or ``module=format`` pairs; it quantizes the
same seeded (or the checkpoint's) weights at build time (norms, the router and the embedding stay in ``dtype``);
``kv_dtype="int8"`` (or ``"fp8"`` on a GPU with fp8) stores the KV cache in 8 bits with a scale per token per
KV head (``kernels.quant``). Under tensor parallelism every rank quantizes the full weights, then keeps its
shard of the quantized values (``kernels.tp``), and its 8-bit cache holds its KV heads. Latent attention's projections are quantized
too; its kv_b_proj runs quantized in prefill and, dequantized once at load, in the absorbed decode
(``kernels.quant.absorbed_kv_b``). DeepSeek Sparse Attention (``cfg.index_topk``: DeepSeek-V3.2, GLM-5): the
indexer's key cache ``index_cache`` [n_layers, max_slots, max_len, index_head_dim] beside the latent cache (the
activation dtype, not the engines' fp8 that ``formulas.dsa`` prices), each query attending to its top-k
(``indexer``, ``kernels.dsa``); GLM-5's shared layers reuse the step's last selection.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from roofline.errors import RooflineError
from roofline.models import ModelConfig

from ._common import dtype_name, torch_dtype
from .backend import get_ops
from .checkpoint import load_weights
from .mla_layer import mla_attention, mla_decode_attend, mla_prefill_attend
from .quant import KV_DTYPES, kv_storage, prepare_model_torch, quantize_model_weights
from .run_precision import check_run, check_tp, run_precision
from .rope import rope_tables
from .sinks import decode_with_sinks, prefill_with_sinks
from .tp import TPGroup, embed, ep_experts, shard_weights, tp_parts
from .weights import init_weights


def _linear(ops, x, w: dict, key: str, bias_key: str):
    b = w.get(bias_key)
    return ops.linear(x, w[key]) if b is None else ops.linear(x, w[key], bias=b)


def attention_options(cfg: ModelConfig, layer: int) -> dict:
    """The keywords layer ``layer``'s attention kernels take beyond the defaults: its window or chunk, the softcap
    and a score scale other than 1/sqrt(head_dim)."""
    kw = {}
    if cfg.windows[layer]:
        kw["window"] = cfg.windows[layer]
    if cfg.chunks[layer]:                                   # Llama-4's chunked local attention
        kw["chunk"] = cfg.chunks[layer]
    if cfg.attn_softcap:
        kw["softcap"] = cfg.attn_softcap
    if cfg.query_scale:
        kw["sm_scale"] = cfg.query_scale
    return kw



def transformer_layer(ops, cfg: ModelConfig, w: dict, x, cos, sin, pos, tok_slot, k_cache, v_cache, attend,
                      reduce=None, kv_scales=None, attn_kw=None, delta=None, index_cache=None, mamba=None):
    """One layer on T token rows; ``attend(q, k_cache, v_cache, **kw) -> o`` is the prefill or decode attention.

    The ops are ``roofline.layer.model_ops``'s, in its order; which ones run follows the config: q/k/v (and
    o, MLP) biases, qk-norm, the MLP's activation, Gemma's norms after attention and the MLP. ``attn_kw``:
    this layer's window, softcap and score scale (``attention_options``); ``cos``/``sin`` its RoPE tables.
    ``reduce`` (tensor parallelism: an all-reduce) sums the row-parallel o_proj and down_proj partial
    outputs before each residual add; ``cfg`` then holds one rank's heads and intermediate size.
    ``kv_scales`` = (k_scale, v_scale) of an 8-bit cache: kv_append writes them, and ``attend`` gets
    them as ``scales=``. A linear's weight may be a ``kernels.quant_weight.QuantWeight`` (ops.linear takes both).
    A Gated DeltaNet layer (its weights have ``w_conv``) mixes with ``deltanet_mixer`` on ``delta`` (its
    ``DeltaState``) instead of attending.
    ``index_cache`` [slots, L, Di]: DeepSeek Sparse Attention's indexer keys of this layer (``mla_attention``).
    A Mamba-2 layer (its weights have ``w_in_proj``) mixes with ``mamba_mixer`` on ``mamba`` (its ``MambaState``); a
    "hybrid" one (Falcon-H1: attention weights too) sums the two mixers' outputs. A layer with no mixer (Nemotron-H's
    MLP blocks: no attention, DeltaNet or Mamba-2 weights) runs its MLP alone; one with no MLP weights (its mixer
    blocks) returns after the mixer's residual."""
    reduce = reduce or (lambda t: t)
    akw = dict(attn_kw or {})
    if "sinks" in w:
        akw["sinks"] = w["sinks"]
    # x: [T, H]   pos, tok_slot: [T]   k_cache, v_cache: [slots, Hkv, L, D]
    eps = cfg.rms_eps
    if cfg.mla:
        h = ops.rmsnorm(x, w["attn_norm"], eps) if "attn_norm" in w else x
        a = reduce(_linear(ops, mla_attention(ops, cfg, w, h, cos, sin, pos, tok_slot, k_cache, v_cache, attend,
                                              index_cache), w, "wo", "bo"))
        return _mlp(ops, cfg, w, ops.residual_add(x, a), reduce)
    if "wk" not in w and "w_in_proj" not in w and "w_conv" not in w:    # no mixer (Nemotron-H's MLP blocks)
        return _mlp(ops, cfg, w, x, reduce)
    h = ops.rmsnorm(x, w["attn_norm"], eps) if "attn_norm" in w else x    # OLMo-2: no norm before attention
    if "w_in_proj" in w:                                                 # Mamba-2 (and Falcon-H1's attention beside)
        m = mamba_mixer(ops, cfg, w, h, mamba)
        if "wk" not in w:
            return _mixer_residual(ops, cfg, w, x, m, reduce)
        a = attention_mixer(ops, cfg, w, _times(h, layer_scale(cfg, "attention_in_multiplier")), cos, sin, pos,
                            tok_slot, k_cache, v_cache, attend, reduce, kv_scales, akw)
        a = _times(a, layer_scale(cfg, "attention_out_multiplier"))     # Falcon-H1: mamba x m + attention x m'
        return _mixer_residual(ops, cfg, w, x, ops.residual_add(m, a), reduce)
    if "w_conv" in w:                                                    # Gated DeltaNet (attn_kw: its state)
        return _mlp(ops, cfg, w, ops.residual_add(x, deltanet_mixer(ops, cfg, w, h, delta)), reduce)
    a = attention_mixer(ops, cfg, w, h, cos, sin, pos, tok_slot, k_cache, v_cache, attend, reduce, kv_scales, akw)
    return _mixer_residual(ops, cfg, w, x, a, reduce)


def layer_scale(cfg: ModelConfig, name: str, default=1.0):
    """A per-layer multiplier of ``cfg.layer_scales`` (Falcon-H1's muP: a float, or a tuple for ssm_multipliers and
    mlp_multipliers), ``default`` where the config has none."""
    return dict(cfg.layer_scales).get(name, default)


def _times(t, f: float):
    """t x a multiplier, t itself for 1 (a multiplier of 1 is no op: the cost model's)."""
    return t if f == 1.0 else t * f


def _mixer_residual(ops, cfg: ModelConfig, w: dict, x, a, reduce):
    """The mixer's branch a into the residual (Gemma's norm after it, Granite's multiplier), then the MLP half."""
    if "post_attn_norm" in w:
        a = ops.rmsnorm(a, w["post_attn_norm"], cfg.rms_eps)
    if cfg.residual_multiplier:                                          # Granite: x + m * branch
        a = a * cfg.residual_multiplier
    return _mlp(ops, cfg, w, ops.residual_add(x, a), reduce)


def attention_mixer(ops, cfg: ModelConfig, w: dict, h, cos, sin, pos, tok_slot, k_cache, v_cache, attend, reduce,
                    kv_scales, akw):
    """Attention on the normed rows h [T, H] (``transformer_layer``'s): q/k/v, their norms, RoPE, the KV cache,
    ``attend``, the output gate and o_proj (reduced under tensor parallelism) -> [T, H]."""
    T, D, eps = h.shape[0], cfg.head_dim, cfg.rms_eps
    gate = None
    if cfg.attn_gate:                                                    # Qwen3-Next: each head's q, then its gate
        qg = _linear(ops, h, w, "wq", "bq").view(T, cfg.n_heads, 2 * D)
        q, gate = qg[..., :D].contiguous(), qg[..., D:].reshape(T, cfg.q_dim)
    else:
        q = _linear(ops, h, w, "wq", "bq").view(T, cfg.n_heads, D)       # q: [T, Hq, D]
    k = _times(_linear(ops, h, w, "wk", "bk"), layer_scale(cfg, "key_multiplier"))   # Falcon-H1's key multiplier
    k = k.view(T, cfg.n_kv_heads, D)                                     # k: [T, Hkv, D]
    v = _linear(ops, h, w, "wv", "bv").view(T, cfg.n_kv_heads, D)        # v: [T, Hkv, D]
    if "q_norm" in w and cfg.qk_norm_whole:                              # OLMo-2: over the whole projection
        q = ops.rmsnorm(q.reshape(T, cfg.q_dim), w["q_norm"], eps).view(T, cfg.n_heads, D)
        k = ops.rmsnorm(k.reshape(T, cfg.kv_dim), w["k_norm"], eps).view(T, cfg.n_kv_heads, D)
    elif "q_norm" in w:                                                  # qk-norm: over each head's D features
        q = ops.rmsnorm(q.reshape(T * cfg.n_heads, D), w["q_norm"], eps).view(T, cfg.n_heads, D)
        k = ops.rmsnorm(k.reshape(T * cfg.n_kv_heads, D), w["k_norm"], eps).view(T, cfg.n_kv_heads, D)
    if cos is not None:                                                  # None: a NoPE layer (no RoPE)
        rd = cfg.rotary_dim                                              # partial rotary: the first rd dims
        ops.rope(q[..., :rd], k[..., :rd], cos, sin, pos) if rd and rd < D else ops.rope(q, k, cos, sin, pos)
        if cfg.qk_l2_norm:                                               # Llama-4: x / rms(x) per head, no weight
            one = torch.ones(D, dtype=q.dtype, device=q.device)
            q = ops.rmsnorm(q.reshape(T * cfg.n_heads, D), one, eps).view(T, cfg.n_heads, D)
            k = ops.rmsnorm(k.reshape(T * cfg.n_kv_heads, D), one, eps).view(T, cfg.n_kv_heads, D)
    elif cfg.attn_temperature:                                           # Llama-4's NoPE layers: q x a factor of pos
        floor, scale = cfg.attn_temperature
        t = torch.log1p(torch.floor((pos.float() + 1.0) / floor)) * scale + 1.0
        q = (q * t[:, None, None]).to(q.dtype)
    if kv_scales is None:
        ops.kv_append(k, v, k_cache, v_cache, tok_slot, pos)
        o = attend(q, k_cache, v_cache, **akw)                           # o: [T, Hq, D]
    else:
        ops.kv_append(k, v, k_cache, v_cache, tok_slot, pos, scales=kv_scales)
        o = attend(q, k_cache, v_cache, scales=kv_scales, **akw)
    o = o.reshape(T, cfg.q_dim)
    if gate is not None:
        o = ops.sigmoid_gate(o, gate)
    return reduce(_linear(ops, o, w, "wo", "bo"))


def mamba_mixer(ops, cfg: ModelConfig, w: dict, h, st: "MambaState"):
    """Mamba-2 on the rows h [B * T, H] of ``st.batch`` sequences (transformers' torch_forward): in_proj to z, x, B, C,
    dt (in that order; Falcon-H1: h x ssm_in_multiplier first, each of the five x its ssm_multipliers factor after),
    the causal conv1d over x, B, C (its bias, SiLU) with the slots' conv states, the SSD scan
    (chunked prefill after the slots' states when ``st.has_state``, clamping dt to the config's limits; the recurrent
    step in decode, which clamps nothing, as transformers' cached step), the gated RMSNorm of y x silu(z) in
    mamba_groups groups (Falcon-H1's order: each group's norm, then x silu(z): ``mamba_norm_first``; or y x silu(z)
    alone: ``mamba_norm`` False), out_proj (Falcon-H1: x ssm_out_multiplier) -> [B * T, H]."""
    N, B = h.shape[0], st.batch
    T = N // B
    Hm, P, G, Ns = cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_groups, cfg.mamba_state
    inner, gn = Hm * P, G * Ns
    zxbcdt = _linear(ops, _times(h, layer_scale(cfg, "ssm_in_multiplier")), w, "w_in_proj", "b_in_proj")
    mup = layer_scale(cfg, "ssm_multipliers", (1.0,) * 5)               # Falcon-H1: z, x, B, C, dt x its own factor
    if any(f != 1.0 for f in mup):
        zxbcdt = torch.cat([_times(t, f) for t, f in zip(torch.split(
            zxbcdt, [inner, inner, gn, gn, Hm], dim=-1), mup)], dim=-1)
    z, xbc, dt = torch.split(zxbcdt, [inner, inner + 2 * gn, Hm], dim=-1)
    xbc = ops.conv1d(xbc.reshape(B, T, -1), w["w_conv"], w.get("b_conv"), st.conv, st.slots)      # [B, T, C]
    x, Bm, Cm = torch.split(xbc, [inner, gn, gn], dim=-1)
    ssd = (w["A_log"], w["dt_bias"], w["D"], st.state, st.slots)
    if st.decode:
        y = ops.ssd_decode(x.reshape(B, Hm, P), dt, Bm.reshape(B, G, Ns), Cm.reshape(B, G, Ns), *ssd)
    else:
        y = ops.ssd_prefill(x.reshape(B, T, Hm, P), dt.reshape(B, T, Hm), Bm.reshape(B, T, G, Ns),
                            Cm.reshape(B, T, G, Ns), *ssd,
                            chunk=cfg.mamba_chunk, has_state=st.has_state,
                            dt_limit=(cfg.mamba_dt_min, cfg.mamba_dt_max or float("inf")))
    y = y.reshape(N, inner)
    if cfg.mamba_norm and cfg.mamba_norm_first:                          # Falcon-H1: norm(y) per group, x silu(z)
        gs, wn = inner // G, w["w_gnorm"]
        y = torch.cat([ops.rmsnorm(y[:, g * gs:(g + 1) * gs].contiguous(), wn[g * gs:(g + 1) * gs], cfg.rms_eps)
                       for g in range(G)], dim=-1) if G > 1 else ops.rmsnorm(y, wn, cfg.rms_eps)
        y = ops.swiglu(z.contiguous(), y)
    elif cfg.mamba_norm:
        y = ops.gated_group_rmsnorm(y, z, w["w_gnorm"], G, cfg.rms_eps)
    else:                                                                # Falcon-H1: y x silu(z)
        y = ops.swiglu(z.contiguous(), y)
    return _times(_linear(ops, y, w, "w_out", "b_out_proj"), layer_scale(cfg, "ssm_out_multiplier"))


class MambaState(SimpleNamespace):
    """What a Mamba-2 layer's call reads: its conv and SSM states ([S, C, kernel - 1] in the activation dtype, [S, H,
    P, N] fp32), the slots [B] of the ``batch`` sequences, ``decode`` (one token each) and ``has_state`` (a prefill
    after cached tokens)."""


def deltanet_mixer(ops, cfg: ModelConfig, w: dict, h, st: "DeltaState"):
    """Gated DeltaNet on the rows h [B * T, H] of ``st.batch`` sequences: the input projections (Qwen3-Next's fused
    in_proj_qkvz / in_proj_ba grouped per key head, as transformers' fix_query_key_value_ordering splits them;
    Qwen3.5's four), the causal conv1d over q, k, v with the slots' conv states, the gates, the chunked rule
    (prefill) or the recurrent step (decode) on the slots' recurrent states, the gated RMSNorm by z, out_proj."""
    N, B = h.shape[0], st.batch
    Hk, Hv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
    r = Hv // Hk
    if "w_in_proj_qkvz" in w:
        m = ops.linear(h, w["w_in_proj_qkvz"]).view(N, Hk, 2 * dk + 2 * r * dv)
        q, k, v, z = torch.split(m, [dk, dk, r * dv, r * dv], dim=-1)
        b, a = torch.split(ops.linear(h, w["w_in_proj_ba"]).view(N, Hk, 2 * r), [r, r], dim=-1)
        qkv = torch.cat([q.reshape(N, Hk * dk), k.reshape(N, Hk * dk), v.reshape(N, Hv * dv)], dim=-1)
        z, b, a = z.reshape(N * Hv, dv), b.reshape(N, Hv), a.reshape(N, Hv)
    else:
        qkv = ops.linear(h, w["w_in_proj_qkv"])
        z = ops.linear(h, w["w_in_proj_z"]).view(N * Hv, dv)
        b, a = ops.linear(h, w["w_in_proj_b"]), ops.linear(h, w["w_in_proj_a"])
    x = ops.conv1d(qkv.view(B, N // B, -1), w["w_conv"], None, st.conv, st.slots)     # [B, T, C]
    q, k, v = torch.split(x, [Hk * dk, Hk * dk, Hv * dv], dim=-1)
    g, beta = ops.delta_gates(a, b, w["a_log"], w["dt_bias"])                           # [N, Hv]
    T = N // B
    if st.decode:
        o = ops.delta_decode(q.reshape(B, Hk, dk), k.reshape(B, Hk, dk), v.reshape(B, Hv, dv), g, beta, st.state,
                             st.slots)
    else:
        o = ops.delta_prefill(q.reshape(B, T, Hk, dk), k.reshape(B, T, Hk, dk), v.reshape(B, T, Hv, dv),
                              g.view(B, T, Hv), beta.view(B, T, Hv), st.state, st.slots, has_state=st.has_state)
    o = ops.gated_rmsnorm(o.reshape(N * Hv, dv), z.contiguous(), w["w_gnorm"], cfg.rms_eps)
    return ops.linear(o.view(N, Hv * dv), w["w_out"])


class DeltaState(SimpleNamespace):
    """What a Gated DeltaNet layer's call reads: its conv and recurrent states ([S, C, kernel - 1], [S, Hv, dk,
    dv] fp32), the slots [B] of the ``batch`` sequences, ``decode`` (one token each) and ``has_state`` (a prefill
    after cached tokens)."""


def _mlp(ops, cfg: ModelConfig, w: dict, x, reduce):
    """The MLP half of a layer after the attention residual: a dense gated MLP, or routed experts (+ shared); none in
    a layer without MLP weights (Nemotron-H's mixer blocks)."""
    if "w_down" not in w and "router" not in w:
        return x
    h = ops.rmsnorm(x, w["mlp_norm"], cfg.rms_eps) if "mlp_norm" in w else x
    d = reduce(moe_mlp(ops, cfg, w, h) if "router" in w else dense_mlp(ops, cfg, w, h))
    if "post_mlp_norm" in w:
        d = ops.rmsnorm(d, w["post_mlp_norm"], cfg.rms_eps)
    if cfg.residual_multiplier:
        d = d * cfg.residual_multiplier
    return ops.residual_add(x, d)


def dense_mlp(ops, cfg: ModelConfig, w: dict, h):
    """down(act(gate) x up), or down(relu2(up)) (Nemotron-H: no gate)."""
    if cfg.activation == "relu2":
        return _linear(ops, ops.relu2(_linear(ops, h, w, "w_up", "b_up")), w, "w_down", "b_down")
    act = ops.swiglu if cfg.activation == "silu" else ops.geglu
    gm, dm = layer_scale(cfg, "mlp_multipliers", (1.0, 1.0))            # Falcon-H1: gate x m, down's output x m'
    a = act(_times(_linear(ops, h, w, "w_gate", "b_gate"), gm), _linear(ops, h, w, "w_up", "b_up"))   # a: [T, I]
    return _times(_linear(ops, a, w, "w_down", "b_down"), dm)


def route(ops, cfg: ModelConfig, w: dict, h):
    """(weights [T, k] fp32, expert ids [T, k]) as the family routes: DeepSeek's and ERNIE's logits in fp32 (the
    routers with a correction bias keep an fp32 gate), the others' in the activation dtype (transformers' own)."""
    if cfg.router == "sigmoid_group" or cfg.router_correction:
        logits = h.float() @ w["router"].float()
    else:
        logits = _linear(ops, h, w, "router", "router_bias")
    return ops.route(logits, cfg.n_active, kind=cfg.router, renorm=cfg.norm_topk, n_group=cfg.n_group,
                     topk_group=cfg.topk_group, bias=w.get("router_correction"), scale=cfg.routed_scale)


def moe_mlp(ops, cfg: ModelConfig, w: dict, h):
    """Routed experts (one grouped GEMM, ``ops.moe_experts``) plus the shared expert(s) every token runs.
    ``routed_input`` (Llama-4): each of a token's k rows is its input times its routing weight (in the activation
    dtype), run through its expert with weight 1, and the k outputs summed."""
    weights, ids = route(ops, cfg, w, h)
    T, k = ids.shape
    if cfg.routed_input:
        h_in = (h[:, None, :] * weights.to(h.dtype)[..., None]).reshape(T * k, -1)
        weights, ids = torch.ones(T * k, 1, dtype=torch.float32, device=h.device), ids.reshape(T * k, 1)
    else:
        h_in = h
    y = ops.moe_experts(h_in, w.get("experts_gate"), w["experts_up"], w["experts_down"], weights, ids, activation=cfg.expert_activation, b_gate=w.get("experts_gate_bias"),
                        b_up=w.get("experts_up_bias"), b_down=w.get("experts_down_bias"))
    if cfg.routed_input and k > 1:
        y = y.view(T, k, -1).sum(dim=1)
    if "ws_up" in w:
        u = ops.linear(h, w["ws_up"])
        s = ops.swiglu(ops.linear(h, w["ws_gate"]), u) if "ws_gate" in w else ops.relu2(u)   # Nemotron-H: relu2
        s = ops.linear(s, w["ws_down"])
        if "ws_gate_vec" in w:                                # Qwen2-MoE: sigmoid(x w) scales the shared expert
            s = torch.sigmoid(ops.linear(h, w["ws_gate_vec"])) * s
        y = ops.residual_add(y, s)
    return y


class LlamaModel:
    def __init__(self, cfg: ModelConfig, *, dtype="bf16", backend="triton", device="cpu", seed=0, max_slots=8,
                 max_len=None, tp: TPGroup | None = None, weight_dtype=None, kv_dtype=None, group_size=None,
                 zero_point=False, random_weights: bool = False):
        """``cfg.checkpoint`` (a config read from a folder with *.safetensors) loads the real weights
        (``kernels.checkpoint``) unless ``random_weights``; otherwise weights are random from ``seed``.
        ``weights_info`` says which (and the files' sha256)."""
        self.cfg = cfg
        self.tp = tp if tp is not None and tp.world > 1 else None
        self.shard, self.lcfg = tp_parts(cfg, self.tp)      # lcfg: the sizes this rank's layers hold
        self.dtype = torch_dtype(dtype)
        self.backend = get_ops(backend).name
        self.ops = get_ops(backend)
        self.device = torch.device(device)
        # each module's format: the checkpoint's own as our kernels run it, or the flags' (kernels.run_precision)
        self.precision = run_precision(cfg, dtype_name(self.dtype), weight_dtype, kv_dtype, group_size=group_size,
                                       zero_point=zero_point)
        self.kv_dtype = check_run(self.precision, cfg, self.backend, self.device, kv_dtype)
        self.weight_dtype = self.precision.weight_label
        int4 = {f.group_size: f.zero_point for _, f in self.precision.run.weights if f.name == "int4"}
        if self.tp is not None:
            check_tp(self.precision, cfg, self.tp.world)
        self.max_len = int(max_len or cfg.max_context)
        if self.max_len < 1 or max_slots < 1:
            raise RooflineError(f"max_len ({self.max_len}) and max_slots ({max_slots}) must be at least 1.")
        self.max_slots = int(max_slots)
        if cfg.checkpoint and not random_weights:
            self.w, self.weights_info = load_weights(cfg, cfg.checkpoint, self.dtype, self.device,
                                                     backend=self.backend if self.tp is None and
                                                     not self.precision.flagged else None)
        else:
            self.w = init_weights(cfg, self.dtype, self.device, seed)
            self.weights_info = {"weights": f"random (seed {seed})"}
        # a quantized checkpoint's formats: what runs as stored and what was dequantized (kernels.checkpoint), and
        # where our kernels hold a module otherwise than the checkpoint (kernels.run_precision)
        self.notes = tuple(self.weights_info.get("notes", ())) + self.precision.notes
        quant = self.precision.quantized
        if quant or cfg.checkpoint:                         # the same weights, held per module (all, then sharded)
            self.w = quantize_model_weights(cfg, self.w, self.precision,
                                            backend=self.backend if self.tp is None else "")
        if self.tp is not None:
            self.w = shard_weights(cfg, self.w, self.shard, self.tp.rank)
            if quant and self.backend == "torch":
                prepare_model_torch(self.w)
        self.group_size = next(iter(int4), 0)
        self.zero_point = bool(int4.get(self.group_size))
        rd = cfg.qk_rope_dim if cfg.mla else (cfg.rotary_dim or cfg.head_dim)   # the dims RoPE rotates
        self.cos, self.sin = rope_tables(self.max_len, rd, cfg.rope_theta, self.device, cfg.rope_yarn)
        self.local_rope = (self.cos, self.sin)          # sliding layers with their own plain RoPE (Gemma-3, OLMo-3)
        if cfg.rope_local_theta and (cfg.rope_local_theta != cfg.rope_theta or cfg.rope_yarn):
            self.local_rope = rope_tables(self.max_len, rd, cfg.rope_local_theta, self.device)
        self.k_scale = self.v_scale = None
        self.index_cache = None
        self.lengths = torch.zeros(self.max_slots, dtype=torch.long)             # host-side, per slot
        # MoE: tokens routed to each expert of each layer since the model was built ([L, E]; rows of dense layers 0)
        self.expert_counts = torch.zeros(cfg.n_layers, cfg.n_experts, dtype=torch.long) if cfg.n_experts else None
        self._counting = {i: self._counting_ops(i) for i in cfg.moe_layers}
        self.conv_state = self.delta_state = None
        self._linear = {i: j for j, i in enumerate(cfg.linear_layers)}
        if cfg.linear_layers:   # Gated DeltaNet's state cache, per linear layer and slot (kernels.deltanet)
            n = len(cfg.linear_layers)
            C = 2 * cfg.linear_k_heads * cfg.linear_k_dim + cfg.linear_v_heads * cfg.linear_v_dim
            self.conv_state = torch.zeros(n, self.max_slots, C, cfg.linear_conv - 1, dtype=self.dtype,
                                          device=self.device)                # the last kernel - 1 conv inputs
            self.delta_state = torch.zeros(n, self.max_slots, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim,
                                           dtype=torch.float32, device=self.device)   # the recurrent state
        self.mamba_conv = self.ssm_state = None
        self._mamba = {i: j for j, i in enumerate(cfg.mamba_layers)}
        if cfg.mamba_layers:    # Mamba-2's state cache, per Mamba layer and slot (kernels.mamba, kernels.conv1d)
            n, Hm, P, Ns = len(cfg.mamba_layers), cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_state
            C = Hm * P + 2 * cfg.mamba_groups * Ns
            self.mamba_conv = torch.zeros(n, self.max_slots, C, cfg.mamba_conv - 1, dtype=self.dtype,
                                          device=self.device)                # the last kernel - 1 conv inputs
            self.ssm_state = torch.zeros(n, self.max_slots, Hm, P, Ns, dtype=torch.float32,
                                         device=self.device)                 # the SSM state
        if cfg.mla:   # the latent cache: c_kv [L, slots, max_len, R] and the rope key [L, slots, max_len, P]
            self.k_cache = torch.zeros(cfg.n_layers, self.max_slots, self.max_len, cfg.kv_lora_rank,
                                       dtype=self.dtype, device=self.device)
            self.v_cache = torch.zeros(cfg.n_layers, self.max_slots, self.max_len, cfg.qk_rope_dim,
                                       dtype=self.dtype, device=self.device)
            if cfg.index_topk:   # DSA: the indexer's keys [L, slots, max_len, Di], in the activation dtype (kernels.dsa)
                self.index_cache = torch.zeros(cfg.n_layers, self.max_slots, self.max_len, cfg.index_head_dim,
                                               dtype=self.dtype, device=self.device)
            return
        shape = (cfg.n_layers, self.max_slots, self.lcfg.n_kv_heads, self.max_len, cfg.head_dim)
        cache_dt = kv_storage(self.kv_dtype) if self.kv_dtype in KV_DTYPES else self.dtype
        self.k_cache = torch.zeros(shape, dtype=cache_dt, device=self.device)     # [L, slots, Hkv, max_len, D]
        self.v_cache = torch.zeros(shape, dtype=cache_dt, device=self.device)
        self.k_scale = self.v_scale = None                                         # 8-bit: [L, slots, Hkv, max_len]
        if self.kv_dtype in KV_DTYPES:
            self.k_scale = torch.zeros(shape[:-1], dtype=torch.float32, device=self.device)
            self.v_scale = torch.zeros(shape[:-1], dtype=torch.float32, device=self.device)
        self.lengths = torch.zeros(self.max_slots, dtype=torch.long)             # host-side, per slot

    def _delta(self, slots, decode: bool, has_state: bool, conv=None, state=None) -> DeltaState | None:
        """The call's DeltaState over every linear layer ([n_linear, S, ...] caches: the model's unless given)."""
        if not self._linear:
            return None
        return DeltaState(batch=slots.shape[0], slots=slots, decode=decode, has_state=has_state,
                          conv=self.conv_state if conv is None else conv, state=self.delta_state if state is None
                          else state)

    def _mamba_state(self, slots, decode: bool, has_state: bool, conv=None, state=None) -> MambaState | None:
        """The call's MambaState over every Mamba-2 layer ([n_mamba, S, ...] caches: the model's unless given)."""
        if not self._mamba:
            return None
        return MambaState(batch=slots.shape[0], slots=slots, decode=decode, has_state=has_state,
                          conv=self.mamba_conv if conv is None else conv, state=self.ssm_state if state is None
                          else state)

    @property
    def state_kind(self) -> str:
        """The kind of layer that keeps a state at a slot's end ("Gated DeltaNet", "Mamba-2"), or ""."""
        return "Gated DeltaNet" if self._linear else "Mamba-2" if self._mamba else ""

    def _scales(self, i):
        """Layer ``i``'s (k_scale, v_scale) of an 8-bit cache, or None."""
        return None if self.k_scale is None else (self.k_scale[i], self.v_scale[i])

    # ---- checks -------------------------------------------------------------------------
    def _slot(self, slot) -> int:
        s = int(slot)
        if not 0 <= s < self.max_slots:
            raise RooflineError(f"slot {s} does not exist: slots are 0..{self.max_slots - 1} (max_slots).")
        return s

    def _tokens(self, tokens, name="tokens") -> torch.Tensor:
        t = torch.as_tensor(tokens)
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be integer token ids, got dtype {t.dtype}.")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.cfg.vocab):
            raise RooflineError(f"{name} must be token ids in 0..{self.cfg.vocab - 1} (the vocabulary).")
        return t.to(self.device, torch.long)

    def _logits(self, x) -> torch.Tensor:
        h = self.ops.rmsnorm(x, self.w["final_norm"], self.cfg.rms_eps)
        out = self.ops.linear(h, self.w["lm_head"])
        if self.tp is not None:                          # vocab-parallel: gather every rank's logits, drop padding
            out = self.tp.all_gather_last(out)[..., : self.cfg.vocab]
        out = out.float()
        if self.cfg.logits_scaling:                      # Granite: logits / logits_scaling
            out = out / self.cfg.logits_scaling
        if self.cfg.final_softcap:                       # Gemma-2: logits -> c * tanh(logits / c)
            c = self.cfg.final_softcap
            out = torch.tanh(out / c) * c
        return out

    def _embed(self, tokens) -> torch.Tensor:
        if self.tp is None:
            x = self.ops.embedding(tokens, self.w["embed"])
        else:
            x = embed(self.ops, tokens, self.w["embed"], self.shard.vocab_rows(self.tp.rank), self.tp)
        if self.cfg.embed_scale:                         # Gemma: sqrt(hidden), rounded to the activation dtype
            x = x * torch.tensor(self.cfg.hidden ** 0.5, dtype=x.dtype)
        elif self.cfg.embed_multiplier:                  # Granite's embedding_multiplier
            x = x * self.cfg.embed_multiplier
        return x

    def _counting_ops(self, i):
        """The ops with ``route`` counting layer ``i``'s choices into ``expert_counts`` (a measured expert load:
        ``roofline explain --expert-load`` takes it)."""
        def route(*a, **kw):
            weights, ids = self.ops.route(*a, **kw)
            self.expert_counts[i] += torch.bincount(ids.reshape(-1).cpu(), minlength=self.cfg.n_experts)
            return weights, ids
        ep = {}
        if self.tp is not None and self.tp.ep > 1:          # expert parallel: dispatch, own experts, combine
            ep = {"moe_experts": partial(ep_experts, self.ops.moe_experts, self.tp)}
        return SimpleNamespace(**{**vars(self.ops), "route": route, **ep})

    def _layer(self, i, x, pos, tok_slot, k_cache, v_cache, attend, scales=None, delta=None, index_cache=None,
               mamba=None):
        if i in self._linear:                            # this layer's slice of the call's DeltaState
            j = self._linear[i]
            delta = DeltaState(**{**vars(delta), "conv": delta.conv[j], "state": delta.state[j]})
        if i in self._mamba:                             # this layer's slice of the call's MambaState
            j = self._mamba[i]
            mamba = MambaState(**{**vars(mamba), "conv": mamba.conv[j], "state": mamba.state[j]})
        cos, sin = self.local_rope if self.cfg.windows[i] else (self.cos, self.sin)
        if i in self.cfg.nope_layers:
            cos = sin = None
        ops = self._counting[i] if i in self._counting else self.ops
        return transformer_layer(ops, self.lcfg, self.w["layers"][i], x, cos, sin, pos, tok_slot,
                                 k_cache, v_cache, attend, self.tp.all_reduce if self.tp is not None else None,
                                 kv_scales=scales, attn_kw=attention_options(self.cfg, i), delta=delta,
                                 index_cache=self.index_cache[i] if index_cache is None and self.index_cache is not None
                                 else index_cache, mamba=mamba)

    # ---- phases -------------------------------------------------------------------------
    def prefill(self, tokens, slot: int, logits: bool = True, all_logits: bool = False) -> torch.Tensor | None:
        """Append ``tokens`` [n] to ``slot`` after its current length; return the last position's logits [vocab].

        ``logits=False`` skips the final norm and lm_head (None is returned): a non-final chunk of a
        chunked prefill needs no prediction, and the workload model charges lm_head once per prompt.
        ``all_logits``: every position's logits [n, vocab] (a speculative verify step: k + 1 tokens after the
        cached prefix, each position's prediction checked against the next draft token).
        """
        s = self._slot(slot)
        tokens = self._tokens(tokens)
        if tokens.dim() != 1:
            raise ValueError(f"tokens must have shape [n], got {list(tokens.shape)}.")
        n, p = tokens.shape[0], int(self.lengths[s])
        if n == 0:
            raise RooflineError("prefill got a chunk of zero tokens: pass at least one token.")
        if p + n > self.max_len:
            raise RooflineError(f"slot {s} would hold {p + n} tokens, past the KV cache capacity of {self.max_len} "
                                "(max_len): shorten the prompt or build the model with a larger max_len.")
        cfg, ops = self.lcfg, self.ops
        pos = torch.arange(p, p + n, device=self.device)                   # pos: [n]
        tok_slot = torch.full((n,), s, dtype=torch.long, device=self.device)
        slots = tok_slot[:1]                                               # slots: [B=1]

        def attend(q, kc, vc, **kw):                                       # q: [n, Hq, D] -> [1, n, Hq, D]
            fn = prefill_with_sinks if "sinks" in kw and ops.name != "triton" else ops.prefill_attention
            return fn(q.view(1, n, cfg.n_heads, cfg.head_dim), kc, vc, slots, p, **kw).reshape(q.shape)

        if cfg.mla:
            attend = mla_prefill_attend(ops, cfg, slots, p, n)

        if p == 0 and self._linear:                                        # a fresh sequence: zero states
            self.conv_state[:, s].zero_()
        if p == 0 and self._mamba:
            self.mamba_conv[:, s].zero_()
        delta, mamba = self._delta(slots, False, p > 0), self._mamba_state(slots, False, p > 0)
        x = self._embed(tokens)                                            # x: [n, H]
        for i in range(len(self.w["layers"])):
            x = self._layer(i, x, pos, tok_slot, self.k_cache[i], self.v_cache[i], attend, self._scales(i), delta,
                            mamba=mamba)
        self.lengths[s] = p + n
        if all_logits:
            return self._logits(x)                                         # [n, vocab] fp32
        return self._logits(x[-1:])[0] if logits else None                 # [vocab] fp32

    def decode_step(self, tokens, slots) -> torch.Tensor:
        """One new token for each of ``slots`` [B] (their lengths may differ); returns logits [B, vocab]."""
        tokens = self._tokens(tokens)
        slots_h = torch.as_tensor(slots, dtype=torch.long).cpu()
        if tokens.dim() != 1 or slots_h.shape != tokens.shape:
            raise ValueError(f"tokens and slots must both have shape [B], got {list(tokens.shape)} and "
                             f"{list(slots_h.shape)}.")
        B = tokens.shape[0]
        if B == 0:
            raise RooflineError("decode_step got no sequences: pass at least one token and slot.")
        for s in slots_h.tolist():
            self._slot(s)
        if len(set(slots_h.tolist())) != B:
            raise RooflineError(f"decode_step got a slot twice ({slots_h.tolist()}): one token per slot per step.")
        pos_h = self.lengths[slots_h]                                      # tokens already cached
        if int(pos_h.max()) + 1 > self.max_len:
            raise RooflineError(f"a decode step would grow a slot past the KV cache capacity of {self.max_len} "
                                "(max_len): finish or reset that sequence.")
        ops = self.ops
        pos = pos_h.to(self.device)                                        # pos: [B]
        slots_d = slots_h.to(self.device)
        lens = pos + 1                                                     # keys per sequence, new one included
        max_len = int(pos_h.max()) + 1

        def attend(q, kc, vc, **kw):                                       # q: [B, Hq, D]
            fn = decode_with_sinks if "sinks" in kw and ops.name != "triton" else ops.decode_attention
            return fn(q, kc, vc, lens, slots_d, max_len=max_len, **kw)

        if self.cfg.mla:
            attend = mla_decode_attend(ops, self.lcfg, lens, slots_d, max_len)   # this rank's heads

        delta, mamba = self._delta(slots_d, True, True), self._mamba_state(slots_d, True, True)
        x = self._embed(tokens)                                            # x: [B, H]
        for i in range(len(self.w["layers"])):
            x = self._layer(i, x, pos, slots_d, self.k_cache[i], self.v_cache[i], attend, self._scales(i), delta,
                            mamba=mamba)
        self.lengths[slots_h] = pos_h + 1
        return self._logits(x)                                             # [B, vocab] fp32

    def forward_full(self, tokens) -> torch.Tensor:
        """Reference forward over tokens [1, S] with no cache (K/V kept in temporaries): logits [S, vocab]."""
        tokens = self._tokens(tokens)
        if tokens.dim() != 2 or tokens.shape[0] != 1 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must have shape [1, S] with S >= 1, got {list(tokens.shape)}.")
        S = tokens.shape[1]
        if S > self.max_len:
            raise RooflineError(f"{S} tokens exceed the model's max_len of {self.max_len}.")
        cfg, ops = self.lcfg, self.ops
        pos = torch.arange(S, device=self.device)
        zero = torch.zeros(S, dtype=torch.long, device=self.device)
        shape = (1, cfg.n_kv_heads, S, cfg.head_dim)                      # k: [B=1, Hkv, S, D]
        vshape = shape
        if cfg.mla:
            shape, vshape = (1, S, cfg.kv_lora_rank), (1, S, cfg.qk_rope_dim)

        def attend(q, kc, vc, **kw):
            fn = prefill_with_sinks if "sinks" in kw and ops.name != "triton" else ops.prefill_attention
            return fn(q.view(1, S, cfg.n_heads, cfg.head_dim), kc, vc, zero[:1], 0, **kw).reshape(q.shape)

        if cfg.mla:
            attend = mla_prefill_attend(ops, cfg, zero[:1], 0, S)
        delta = None
        if self._linear:                                                   # fresh states of one sequence
            delta = self._delta(zero[:1], False, False, torch.zeros_like(self.conv_state[:, :1]),
                                torch.zeros_like(self.delta_state[:, :1]))
        mamba = None
        if self._mamba:
            mamba = self._mamba_state(zero[:1], False, False, torch.zeros_like(self.mamba_conv[:, :1]),
                                      torch.zeros_like(self.ssm_state[:, :1]))
        x = self._embed(tokens[0])
        for i in range(len(self.w["layers"])):
            kc = torch.empty(shape, dtype=self.k_cache.dtype, device=self.device)   # the cache's dtype (8-bit too)
            vc = torch.empty(vshape, dtype=self.k_cache.dtype, device=self.device)
            sc = None if self.k_scale is None else (torch.empty(shape[:-1], device=self.device),
                                                    torch.empty(shape[:-1], device=self.device))
            ic = None if self.index_cache is None else torch.empty(1, S, cfg.index_head_dim, dtype=self.dtype,
                                                                   device=self.device)
            x = self._layer(i, x, pos, zero, kc, vc, attend, sc, delta, ic, mamba)
        return self._logits(x)                                             # [S, vocab] fp32

    # ---- cache management ---------------------------------------------------------------
    def copy_prefix(self, src_slot: int, dst_slot: int, n: int) -> None:
        """Reuse the first ``n`` cached tokens of ``src_slot`` in ``dst_slot`` (its length becomes n)."""
        src, dst, n = self._slot(src_slot), self._slot(dst_slot), int(n)
        have = int(self.lengths[src])
        if n < 0 or n > have:
            raise RooflineError(f"cannot reuse a prefix of {n} tokens: slot {src} holds {have}; "
                                f"give 0..{have}.")
        if self.state_kind and 0 < n < have:     # the state cache keeps each slot's state at its end only
            raise RooflineError(f"cannot reuse a prefix of {n} tokens of slot {src} holding {have}: its "
                                f"{self.state_kind} layers keep their state after all {have} tokens only; reuse all "
                                f"{have}, or prefill from scratch.")
        if self._linear and src != dst and n:
            self.conv_state[:, dst].copy_(self.conv_state[:, src])
            self.delta_state[:, dst].copy_(self.delta_state[:, src])
        if self._mamba and src != dst and n:
            self.mamba_conv[:, dst].copy_(self.mamba_conv[:, src])
            self.ssm_state[:, dst].copy_(self.ssm_state[:, src])
        if src != dst and n and self.cfg.mla:          # latent caches: [L, slots, max_len, R or P]
            self.k_cache[:, dst, :n].copy_(self.k_cache[:, src, :n])
            self.v_cache[:, dst, :n].copy_(self.v_cache[:, src, :n])
            if self.index_cache is not None:
                self.index_cache[:, dst, :n].copy_(self.index_cache[:, src, :n])
        elif src != dst and n:
            self.k_cache[:, dst, :, :n].copy_(self.k_cache[:, src, :, :n])
            self.v_cache[:, dst, :, :n].copy_(self.v_cache[:, src, :, :n])
            if self.k_scale is not None:
                self.k_scale[:, dst, :, :n].copy_(self.k_scale[:, src, :, :n])
                self.v_scale[:, dst, :, :n].copy_(self.v_scale[:, src, :, :n])
        self.lengths[dst] = n

    def prefill_with_prefix(self, tokens, slot: int, src_slot: int, prefix: int) -> torch.Tensor:
        """Prefix reuse in one call: take ``prefix`` tokens' K/V from ``src_slot``, prefill the rest."""
        tokens = self._tokens(tokens)
        if prefix >= tokens.shape[0]:
            raise RooflineError(f"the reused prefix ({prefix}) must be shorter than the prompt ({tokens.shape[0]}): "
                                "at least the last prompt token is always recomputed.")
        self.copy_prefix(src_slot, slot, prefix)
        return self.prefill(tokens[prefix:], slot)

    def reset(self, slot: int) -> None:
        self.lengths[self._slot(slot)] = 0

    @property
    def quant_label(self) -> str:
        """'' for a float model, else what the run holds, e.g. 'int4 weights (g64, zero points), int8 KV cache',
        'experts=mxfp4 weights' (``RunPrecision.weight_label``; ``precision.describe()`` says each module)."""
        zp = ", zero points" if self.zero_point else ""
        parts = [f"{self.weight_dtype} weights" + (f" (g{self.group_size}{zp})" if self.group_size else "")
                 ] if self.precision.quantized else []
        if self.kv_dtype in KV_DTYPES:
            parts.append(f"{self.kv_dtype} KV cache")
        return ", ".join(parts)

    @staticmethod
    def greedy(logits: torch.Tensor) -> torch.Tensor:
        """Greedy sampling: argmax over the last dim ([vocab] -> scalar, [B, vocab] -> [B])."""
        return logits.argmax(dim=-1)
