"""The layer as data: a model config's ops, each described once, in the order they run.

``model_ops(cfg, sh)`` lists every op of a step for the config ``cfg`` at one rank's sizes ``sh``
(``roofline.parallel.shard``): the parts before the layers (embedding, its scale), the per-layer ops and
the parts after (final norm, lm_head, the logits' softcap). Each ``OpSpec`` says its name, its kind
(what formula costs it and what kernel runs it), its colour group in the reports, how many instances a
step runs (layers with different attention windows are separate ops: ``attention`` and
``attention_sliding``), its sizes, and the weights it reads (``WeightSpec``: our key, shape and layout,
the Hugging Face tensor it loads from, how it shards under --tp).

Everything that used to list the Llama layer by hand loops over this list instead: the workload's costs
(``roofline.workload``), parameter and weight-byte counts and the memory estimate, weight
initialisation, sharding and checkpoint loading (``kernels``), the runners, the compile check's
variants, the analysis's op counts and the reports' colours and legend order.

Kinds: embedding, scale (an elementwise multiply), norm (RMSNorm over ``width`` features, ``rows``
rows per token), linear (``in_features`` -> ``out_features``, ``bias``), rope, kv_append, attention
(``window`` keys, 0 for full; ``softcap``), residual, activation (``fn`` silu or gelu_tanh), softcap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from .models import ModelConfig
from .parallel import Shard, shard

KINDS = ("embedding", "scale", "norm", "linear", "rope", "kv_append", "attention", "residual", "activation",
         "softcap")
TENSOR_KINDS = ("linear", "attention")   # run on tensor cores in the activation dtype; the rest in fp32
LAYER_OP = "layer"                       # one whole transformer layer timed as one op


@dataclass(frozen=True)
class WeightSpec:
    """One weight tensor an op reads.

    ``shape`` is this rank's, in our layout: linear [in, out], bias [out], norm [width], embedding [V, H].
    ``hf`` names the Hugging Face tensor (per-layer names are relative to ``model.layers.{i}.``);
    ``part`` = (index, sizes) when it is one slice, along the output dimension, of a fused HF tensor
    (Phi-3's qkv_proj and gate_up_proj). ``offset``: the file stores w and the model multiplies by 1 + w
    (Gemma's norms). ``shard``: how --tp splits it (``kernels.tp``): "q_cols", "kv_cols", "i_cols" (column
    parallel, by query heads, KV heads or intermediate features), "q_rows", "i_rows" (row parallel),
    "rank0" (a row-parallel linear's bias: added once, by rank 0), "vocab" (rows of the padded vocabulary),
    "replicated".
    """

    key: str
    shape: tuple
    role: str                    # "linear" | "bias" | "norm" | "embedding"
    hf: str
    shard: str = "replicated"
    part: tuple = ()
    offset: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str
    part: str                    # "pre" | "layer" | "post"
    group: str                   # colour group: embed, norm, attention, mlp, residual, head
    count: int                   # instances per step
    weights: tuple = ()
    dims: dict = field(default_factory=dict, compare=False, hash=False)
    layers: tuple = ()           # the layer indices that run it (per-layer ops)

    @property
    def tensor(self) -> bool:
        return self.kind in TENSOR_KINDS

    @property
    def per_layer(self) -> bool:
        return self.part == "layer"


def _linear(name, group, k, n, key, hf, shard_w, count, layers, bias=False, bias_key=None, bias_hf=None,
            bias_shard=None, part=()):
    ws = [WeightSpec(key, (k, n), "linear", hf, shard_w, part)]
    if bias:
        ws.append(WeightSpec(bias_key, (n,), "bias", bias_hf, bias_shard, part))
    return OpSpec(name, "linear", "layer", group, count, tuple(ws),
                  {"in_features": k, "out_features": n, "bias": bias}, layers)


def _norm(name, key, hf, width, count, layers, offset, group="norm", rows=1, part="layer"):
    return OpSpec(name, "norm", part, group, count, (WeightSpec(key, (width,), "norm", hf, "replicated",
                                                                 offset=offset),),
                  {"width": width, "rows": rows}, layers)


def model_ops(cfg: ModelConfig, sh: Shard | None = None) -> tuple:
    """Every op of one step of ``cfg`` (one rank's sizes under ``sh``), in the order they run."""
    return _model_ops(cfg, sh or shard(cfg, 1))


@lru_cache(maxsize=64)
def _model_ops(cfg: ModelConfig, sh: Shard) -> tuple:
    L, H, D, I = cfg.n_layers, cfg.hidden, cfg.head_dim, sh.intermediate
    Hq, Hkv, qd, kvd = sh.n_heads, sh.n_kv_heads, sh.q_dim, sh.kv_dim
    every = tuple(range(L))
    off = cfg.norm_offset
    fused = cfg.arch == "phi3"
    ops = [OpSpec("embedding", "embedding", "pre", "embed", 1,
                  (WeightSpec("embed", (sh.vocab, H), "embedding", "model.embed_tokens.weight", "vocab"),),
                  {"vocab": sh.vocab, "hidden": H})]
    if cfg.embed_scale:
        ops.append(OpSpec("embed_scale", "scale", "pre", "embed", 1, (), {"width": H, "factor": H ** 0.5}))

    def proj(name, k, n, key, shard_w, hf, part=(), bias=False, bkey=None, bshard=None):
        return _linear(name, "attention" if name[0] in "qkvo" else "mlp", k, n, key,
                       hf if not part else part[0], shard_w, L, every, bias, bkey,
                       (hf.replace(".weight", ".bias") if not part else part[0].replace(".weight", ".bias")),
                       bshard, part[1:] if part else ())

    qkv = "self_attn.qkv_proj.weight"
    sizes = (cfg.q_dim, cfg.kv_dim, cfg.kv_dim)
    ops.append(_norm("attn_norm", "attn_norm", "input_layernorm.weight", H, L, every, off))
    for i, (name, key, n, sh_w, b) in enumerate((("q_proj", "wq", qd, "q_cols", "bq"), ("k_proj", "wk", kvd, "kv_cols", "bk"),
                                                 ("v_proj", "wv", kvd, "kv_cols", "bv"))):
        ops.append(proj(name, H, n, key, sh_w, f"self_attn.{name}.weight", (qkv, i, sizes) if fused else (),
                        cfg.qkv_bias, b, sh_w))
    if cfg.qk_norm:
        ops.append(_norm("q_norm", "q_norm", "self_attn.q_norm.weight", D, L, every, off, "attention", rows=Hq))
        ops.append(_norm("k_norm", "k_norm", "self_attn.k_norm.weight", D, L, every, off, "attention", rows=Hkv))
    ops.append(OpSpec("rope", "rope", "layer", "attention", L, (), {"n_heads": Hq, "n_kv_heads": Hkv,
                                                                    "head_dim": D}, every))
    ops.append(OpSpec("kv_append", "kv_append", "layer", "attention", L, (), {"n_kv_heads": Hkv, "head_dim": D},
                      every))
    windows = cfg.windows
    for name, want in (("attention", False), ("attention_sliding", True)):
        idx = tuple(i for i in every if bool(windows[i]) == want)
        if not idx:
            continue
        if want and len(idx) == L:   # every layer slides (Mistral, Phi-3): one attention op, with its window
            name = "attention"
        ops.append(OpSpec(name, "attention", "layer", "attention", len(idx), (),
                          {"n_heads": Hq, "n_kv_heads": Hkv, "head_dim": D, "window": windows[idx[0]],
                           "softcap": cfg.attn_softcap, "scale": cfg.scale,
                           "rope_theta": (cfg.rope_local_theta or cfg.rope_theta) if want else cfg.rope_theta},
                          idx))
    ops.append(proj("o_proj", qd, H, "wo", "q_rows", "self_attn.o_proj.weight", bias=cfg.o_bias, bkey="bo",
                    bshard="rank0"))
    if cfg.sandwich_norms:
        ops.append(_norm("post_attn_norm", "post_attn_norm", "post_attention_layernorm.weight", H, L, every, off))
    ops.append(OpSpec("attn_residual", "residual", "layer", "residual", L, (), {"width": H}, every))
    ops.append(_norm("mlp_norm", "mlp_norm", "pre_feedforward_layernorm.weight" if cfg.sandwich_norms
                     else "post_attention_layernorm.weight", H, L, every, off))
    gu = "mlp.gate_up_proj.weight"
    ops.append(proj("gate_proj", H, I, "w_gate", "i_cols", "mlp.gate_proj.weight", (gu, 0, (cfg.intermediate,) * 2)
                    if fused else (), cfg.mlp_bias, "b_gate", "i_cols"))
    ops.append(proj("up_proj", H, I, "w_up", "i_cols", "mlp.up_proj.weight", (gu, 1, (cfg.intermediate,) * 2)
                    if fused else (), cfg.mlp_bias, "b_up", "i_cols"))
    act = "swiglu" if cfg.activation == "silu" else "geglu"
    ops.append(OpSpec(act, "activation", "layer", "mlp", L, (), {"width": I, "fn": cfg.activation}, every))
    ops.append(proj("down_proj", I, H, "w_down", "i_rows", "mlp.down_proj.weight", bias=cfg.mlp_bias,
                    bkey="b_down", bshard="rank0"))
    if cfg.sandwich_norms:
        ops.append(_norm("post_mlp_norm", "post_mlp_norm", "post_feedforward_layernorm.weight", H, L, every, off))
    ops.append(OpSpec("mlp_residual", "residual", "layer", "residual", L, (), {"width": H}, every))
    ops.append(_norm("final_norm", "final_norm", "model.norm.weight", H, 1, (), off, part="post"))
    head_w = () if cfg.tie_embeddings else (WeightSpec("lm_head", (H, sh.vocab), "linear", "lm_head.weight", "vocab"),)
    ops.append(OpSpec("lm_head", "linear", "post", "head", 1, head_w,
                      {"in_features": H, "out_features": sh.vocab, "bias": False, "tied": cfg.tie_embeddings}))
    if cfg.final_softcap:
        ops.append(OpSpec("final_softcap", "softcap", "post", "head", 1, (), {"width": sh.vocab,
                                                                             "cap": cfg.final_softcap}))
    return tuple(ops)


def op_names(cfg: ModelConfig) -> tuple:
    """The op names of ``cfg``'s step, in the order they run."""
    return tuple(o.name for o in model_ops(cfg))


def layer_op_names(cfg: ModelConfig) -> tuple:
    return tuple(o.name for o in model_ops(cfg) if o.per_layer)


def op_spec(cfg: ModelConfig, name: str) -> OpSpec:
    for o in model_ops(cfg):
        if o.name == name:
            return o
    raise KeyError(name)


def weight_elements(cfg: ModelConfig, sh: Shard | None = None, *, roles=("linear", "bias", "norm", "embedding")):
    """Elements of every weight the step reads (per-layer weights times their layer count), by ``roles``."""
    total = 0
    for o in model_ops(cfg, sh):
        for w in o.weights:
            if w.role in roles:
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
        from .models import PRESETS

        models = PRESETS.values()
    order: list = []
    for m in models:
        prev = None
        for name in (o.name for o in model_ops(m)):
            if name not in order:
                order.insert(order.index(prev) + 1 if prev is not None else 0, name)
            prev = name
    return tuple(order)
