"""Config readers, one per Hugging Face ``model_type``: a config.json -> one typed ``ModelConfig``.

Refuse, never guess. Each reader knows its family's fields: a field that changes cost or numerics is
read into ``ModelConfig`` (and modelled by ``roofline.layer``'s ops) or refused in one line naming it
("gemma2: attn_logit_softcapping ..."); a field that changes only numerics, not cost (RoPE scaling), is
a note said once. An unknown ``model_type`` is refused with the supported list, and so are the mixtures
of experts and hybrids not modelled (``UNMODELLED_MOE``). Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3
(with latent attention) and GPT-OSS are read into the MoE and MLA fields of ``ModelConfig``.

Adding a dense variant: write ``_read_<type>(d, c)`` (fill the architecture fields of ``c`` from ``d``,
refuse what it cannot model) and add it to ``READERS``; if it brings a new kind of op, describe the op in
``roofline/layer.py`` (and give it a kernel file). Nothing in the analysis, reports or sweep changes.
"""

from __future__ import annotations

from pathlib import Path

from .errors import RooflineError
from .models import (ModelConfig, _bool_field, _float_field, _int_field, _rope, _checked, _HF_HINTS, _HF_NAMES,
                     read_json_file, show_value)

_HF_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
UNMODELLED_MOE = ("deepseek_v2", "dbrx", "jamba", "olmoe", "phimoe", "granitemoe", "qwen3_next", "llama4")


class _Reader:
    """What one config.json says, read field by field: ``get`` (absent and null mean the default) and
    ``refuse`` (a one-line RooflineError naming the model type and the field)."""

    def __init__(self, d: dict, where: str, mtype: str):
        self.d, self.where, self.mtype = d, where, mtype
        self.arch: dict = {"arch": mtype}
        self.notes: list[str] = []

    def get(self, key, default=None):
        v = self.d.get(key)
        return default if v is None else v

    def refuse(self, key, why: str = "is not modelled"):
        raise RooflineError(f"{self.where}: {self.mtype}: {key} = {show_value(self.d.get(key))} {why}; "
                            "costs and logits would be wrong, so the model is refused.")

    def expect(self, key, allowed, default=None):
        """``key`` must be one of ``allowed`` (absent: ``default``), else refused."""
        v = self.get(key, default)
        if v not in allowed:
            self.refuse(key, f"is not modelled (supported: {', '.join(map(str, allowed))})")
        return v

    def flag(self, key, default=False) -> bool:
        return _bool_field(self.where, key, self.get(key, default))

    def number(self, key) -> float:
        """A positive float, or 0.0 when absent or null."""
        v = self.d.get(key)
        return 0.0 if v is None else _float_field(self.where, key, v)

    def activation(self, *keys, want=("silu",)):
        for k in keys:
            if self.d.get(k) is not None:
                v = self.d[k]
                if v in ("silu", "swish"):
                    return "silu"
                if v in ("gelu_pytorch_tanh", "gelu_tanh") or (v == "gelu" and "gelu_tanh" in want):
                    # Gemma-1 configs say "gelu" and run the tanh approximation (transformers forces it)
                    return "gelu_tanh"
                self.refuse(k, "is not modelled (supported: silu, gelu_pytorch_tanh)")
        return want[0]

    def window(self, use_key: str | None = None, max_window_layers: bool = False):
        """sliding_window (0 when absent, null, or switched off by ``use_key``) and per-layer types."""
        n = self.d["num_hidden_layers"]
        w = self.d.get("sliding_window")
        if use_key is not None and not self.flag(use_key):
            w = None
        if w is None:
            self._no_sliding_types()
            return 0, ()
        w = _int_field(self.where, "sliding_window", w, 1, " (keys a windowed query sees)")
        types = self._layer_types(n)
        if types is None:
            if max_window_layers:   # Qwen2/3: layers from max_window_layers on slide
                first = _int_field(self.where, "max_window_layers", self.get("max_window_layers", n), 0)
                types = tuple("sliding" if i >= first else "full" for i in range(n))
            else:
                types = ("sliding",) * n
        if "sliding" not in types:
            return 0, ()
        return w, (() if all(t == "sliding" for t in types) else types)

    def _layer_types(self, n: int):
        lt = self.d.get("layer_types")
        if lt is None:
            return None
        kinds = {"full_attention": "full", "sliding_attention": "sliding"}
        if not isinstance(lt, list) or any(t not in kinds for t in lt):
            self.refuse("layer_types", "is not modelled (supported: full_attention, sliding_attention per layer)")
        if len(lt) != n:
            raise RooflineError(f"{self.where}: layer_types has {len(lt)} entries for num_hidden_layers {n}: give "
                                "one per layer.")
        return tuple(kinds[t] for t in lt)

    def _no_sliding_types(self):
        types = self._layer_types(self.d["num_hidden_layers"])
        if types and "sliding" in types:
            raise RooflineError(f"{self.where}: layer_types has sliding_attention layers but sliding_window is "
                                "null or switched off: give the window.")


# ---- one reader per model_type: fill r.arch, refuse what is not modelled -----------------------------

def _llama_like(r: _Reader) -> None:
    r.arch["activation"] = r.activation("hidden_act")
    if r.get("pretraining_tp", 1) not in (1,):
        r.refuse("pretraining_tp", "is not modelled (only 1: the split-weight matmul of Llama-2 pretraining)")
    if r.get("partial_rotary_factor", 1.0) != 1.0:
        r.refuse("partial_rotary_factor", "is not modelled (RoPE rotates every head dimension)")
    if r.flag("use_bidirectional_attention"):
        r.refuse("use_bidirectional_attention", "is not modelled (attention is causal)")


def _read_llama(r: _Reader) -> None:
    _llama_like(r)
    bias = r.flag("attention_bias")
    r.arch.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.flag("mlp_bias"))


def _read_mistral(r: _Reader) -> None:
    _llama_like(r)
    r.arch["sliding_window"], r.arch["layer_types"] = r.window()


def _read_qwen2(r: _Reader) -> None:
    _llama_like(r)
    r.arch["qkv_bias"] = True       # Qwen2's q/k/v projections always carry biases; o_proj has none
    r.arch["sliding_window"], r.arch["layer_types"] = r.window("use_sliding_window", max_window_layers=True)


def _read_qwen3(r: _Reader) -> None:
    _llama_like(r)
    bias = r.flag("attention_bias")
    r.arch.update(qkv_bias=bias, o_bias=bias, qk_norm=True)
    r.arch["sliding_window"], r.arch["layer_types"] = r.window("use_sliding_window", max_window_layers=True)


def _read_phi3(r: _Reader) -> None:
    _llama_like(r)                  # fused qkv_proj / gate_up_proj: costed as the split ones, loaded into them
    params = r.get("rope_parameters", {})
    if isinstance(params, dict) and params.get("partial_rotary_factor", 1.0) != 1.0:
        r.refuse("rope_parameters.partial_rotary_factor", "is not modelled (RoPE rotates every head dimension)")
    r.arch["sliding_window"], r.arch["layer_types"] = r.window()


def _gemma_common(r: _Reader) -> None:
    r.arch.update(activation=r.activation("hidden_activation", "hidden_act", want=("gelu_tanh",)),
                  norm_offset=True, embed_scale=True)
    if r.flag("attention_bias"):
        r.refuse("attention_bias")
    if r.flag("use_bidirectional_attention"):
        r.refuse("use_bidirectional_attention", "is not modelled (attention is causal)")


def _read_gemma(r: _Reader) -> None:
    _gemma_common(r)


def _read_gemma2(r: _Reader) -> None:
    _gemma_common(r)
    qs = r.number("query_pre_attn_scalar")
    r.arch.update(sandwich_norms=True, query_scale=qs ** -0.5 if qs else 0.0,
                  attn_softcap=r.number("attn_logit_softcapping"), final_softcap=r.number("final_logit_softcapping"))
    w, types = r.window()
    if w and r.d.get("layer_types") is None:      # older configs: even layers (the first) slide
        n = r.d["num_hidden_layers"]
        types = tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
    r.arch["sliding_window"], r.arch["layer_types"] = w, types


def _read_gemma3_text(r: _Reader) -> None:
    _read_gemma2(r)
    r.arch["qk_norm"] = True
    w, types = r.arch["sliding_window"], r.arch["layer_types"]
    if w and r.d.get("layer_types") is None:      # older configs: sliding_window_pattern (every 6th layer full)
        n, every = r.d["num_hidden_layers"], _int_field(r.where, "sliding_window_pattern",
                                                        r.get("sliding_window_pattern", 6), 1)
        types = tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n))
        r.arch["layer_types"] = () if all(t == "sliding" for t in types) else types


def _experts(r: _Reader, *keys) -> int:
    for k in keys:
        if r.d.get(k) is not None:
            return _int_field(r.where, k, r.d[k], 1, " (routed experts)")
    raise RooflineError(f"{r.where}: {r.mtype}: the number of experts ({' or '.join(keys)}) is missing.")


def _sparse_every(r: _Reader) -> tuple:
    """Qwen-MoE's dense layers: mlp_only_layers, and those that decoder_sparse_step skips."""
    n = r.d["num_hidden_layers"]
    step = _int_field(r.where, "decoder_sparse_step", r.get("decoder_sparse_step", 1), 1)
    only = r.get("mlp_only_layers", [])
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        r.refuse("mlp_only_layers", "must list layer indices")
    return tuple(i for i in range(n) if i in only or (i + 1) % step)


def _read_mixtral(r: _Reader) -> None:
    _llama_like(r)
    r.arch["sliding_window"], r.arch["layer_types"] = r.window()
    r.arch.update(n_experts=_experts(r, "num_local_experts", "num_experts"),
                  n_active=_int_field(r.where, "num_experts_per_tok", r.get("num_experts_per_tok", 2), 1),
                  moe_intermediate=r.d["intermediate_size"], router="softmax_topk", norm_topk=True)


def _read_qwen_moe(r: _Reader, qwen3: bool) -> None:
    _llama_like(r)
    if qwen3:
        bias = r.flag("attention_bias")
        r.arch.update(qkv_bias=bias, o_bias=bias, qk_norm=True)
    else:
        r.arch["qkv_bias"] = r.flag("qkv_bias", True)
    r.arch["sliding_window"], r.arch["layer_types"] = r.window("use_sliding_window", max_window_layers=True)
    r.arch.update(n_experts=_experts(r, "num_experts", "num_local_experts"),
                  n_active=_int_field(r.where, "num_experts_per_tok", r.get("num_experts_per_tok", 4), 1),
                  moe_intermediate=_int_field(r.where, "moe_intermediate_size", r.d.get("moe_intermediate_size"), 1),
                  router="softmax_topk", norm_topk=r.flag("norm_topk_prob", False),
                  dense_layers=_sparse_every(r))
    shared = r.get("shared_expert_intermediate_size", 0)
    if shared and not qwen3:
        r.arch.update(shared_intermediate=_int_field(r.where, "shared_expert_intermediate_size", shared, 1),
                      shared_gate=True)


def _read_qwen2_moe(r: _Reader) -> None:
    _read_qwen_moe(r, qwen3=False)


def _read_qwen3_moe(r: _Reader) -> None:
    _read_qwen_moe(r, qwen3=True)


def _read_deepseek_v3(r: _Reader) -> None:
    _llama_like(r)
    if r.flag("attention_bias"):
        r.refuse("attention_bias")
    if r.get("moe_layer_freq", 1) != 1:
        r.refuse("moe_layer_freq", "is not modelled (only 1: every layer after the first dense ones)")
    if r.get("topk_method", "noaux_tc") not in ("noaux_tc",) or r.get("scoring_func", "sigmoid") != "sigmoid":
        r.refuse("topk_method" if r.get("topk_method", "noaux_tc") != "noaux_tc" else "scoring_func",
                 "is not modelled (DeepSeek-V3's sigmoid scores with noaux_tc group routing only)")
    n = r.d["num_hidden_layers"]
    first = _int_field(r.where, "first_k_dense_replace", r.get("first_k_dense_replace", 0), 0)
    E = _experts(r, "n_routed_experts", "num_local_experts")
    inter = _int_field(r.where, "moe_intermediate_size", r.d.get("moe_intermediate_size"), 1)
    rope = _int_field(r.where, "qk_rope_head_dim", r.d.get("qk_rope_head_dim"), 1)
    nope = _int_field(r.where, "qk_nope_head_dim", r.d.get("qk_nope_head_dim"), 1)
    r.arch.update(
        n_experts=E, n_active=_int_field(r.where, "num_experts_per_tok", r.get("num_experts_per_tok", 8), 1),
        moe_intermediate=inter, router="sigmoid_group", norm_topk=r.flag("norm_topk_prob", True),
        routed_scale=_float_field(r.where, "routed_scaling_factor", r.get("routed_scaling_factor", 1.0)),
        n_group=_int_field(r.where, "n_group", r.get("n_group", 1), 1),
        topk_group=_int_field(r.where, "topk_group", r.get("topk_group", 1), 1), router_correction=True,
        shared_intermediate=inter * _int_field(r.where, "n_shared_experts", r.get("n_shared_experts", 0), 0),
        dense_layers=tuple(range(min(first, n))),
        q_lora_rank=_int_field(r.where, "q_lora_rank", r.get("q_lora_rank", 0), 0),
        kv_lora_rank=_int_field(r.where, "kv_lora_rank", r.d.get("kv_lora_rank"), 1),
        qk_rope_dim=rope, qk_nope_dim=nope,
        v_head_dim=_int_field(r.where, "v_head_dim", r.d.get("v_head_dim"), 1),
        query_scale=(nope + rope) ** -0.5 * _yarn_mscale(r) ** 2, rope_interleave=r.flag("rope_interleave", True))
    if r.get("num_nextn_predict_layers", 0):
        r.notes.append(f"num_nextn_predict_layers = {r.d['num_nextn_predict_layers']}: the multi-token-prediction "
                       "layer is not part of a step (not costed, not loaded).")


def _yarn(r: _Reader, theta: float) -> tuple:
    """YaRN's parameters (kernels.rope.rope_tables) from rope_parameters / rope_scaling, () when not YaRN."""
    import math

    for key in ("rope_scaling", "rope_parameters"):
        spec = r.d.get(key)
        if not isinstance(spec, dict) or spec.get("rope_type", spec.get("type")) != "yarn":
            continue
        orig = _int_field(r.where, f"{key}.original_max_position_embeddings",
                          spec.get("original_max_position_embeddings", r.get("max_position_embeddings", 4096)), 1)
        factor = spec.get("factor")
        factor = (r.d.get("max_position_embeddings", orig) / orig if factor is None
                  else _float_field(r.where, f"{key}.factor", factor))

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = spec.get("attention_factor")
        if att is None:
            m, m_all = spec.get("mscale"), spec.get("mscale_all_dim")
            att = get_mscale(factor, m) / get_mscale(factor, m_all) if m and m_all else get_mscale(factor)
        return (float(factor), float(spec.get("beta_fast") or 32), float(spec.get("beta_slow") or 1), orig,
                float(att), bool(spec.get("truncate", True)))
    return ()


def _yarn_mscale(r: _Reader) -> float:
    """DeepSeek's YaRN softmax scale factor (0.1 mscale_all_dim ln(factor) + 1), 1 without YaRN."""
    import math

    spec = r.get("rope_scaling") or r.get("rope_parameters") or {}
    if not isinstance(spec, dict) or spec.get("rope_type", spec.get("type")) != "yarn":
        return 1.0
    factor, m = float(spec.get("factor", 1.0)), float(spec.get("mscale_all_dim", 0.0) or 0.0)
    return 0.1 * m * math.log(factor) + 1.0 if factor > 1 and m else 1.0


def _read_gpt_oss(r: _Reader) -> None:
    _llama_like(r)
    if r.d.get("quantization_config") is not None:
        q = r.d["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else q
        r.notes.append(f"quantization_config {method!r}: the experts' published weights are quantized; costs use "
                       "--weight-dtype (give the dtype you serve), and real weights load only dequantized.")
    w, types = r.window()
    r.arch.update(sliding_window=w, layer_types=types, qkv_bias=r.flag("attention_bias", True),
                  o_bias=r.flag("attention_bias", True), attn_sinks=True,
                  n_experts=_experts(r, "num_local_experts", "num_experts"),
                  n_active=_int_field(r.where, "num_experts_per_tok", r.get("num_experts_per_tok", 4), 1),
                  moe_intermediate=r.d["intermediate_size"], router="topk_softmax", norm_topk=True,
                  router_bias=True, expert_bias=True, expert_activation="swiglu_oai")
    if r.get("swiglu_alpha", 1.702) != 1.702 or r.get("swiglu_limit", 7.0) != 7.0:
        r.refuse("swiglu_alpha" if r.get("swiglu_alpha", 1.702) != 1.702 else "swiglu_limit",
                 "is not modelled (GPT-OSS's alpha 1.702 and limit 7.0 only)")


READERS = {"llama": _read_llama, "mistral": _read_mistral, "qwen2": _read_qwen2, "qwen3": _read_qwen3,
           "phi3": _read_phi3, "gemma": _read_gemma, "gemma2": _read_gemma2, "gemma3_text": _read_gemma3_text,
           "mixtral": _read_mixtral, "qwen2_moe": _read_qwen2_moe, "qwen3_moe": _read_qwen3_moe,
           "deepseek_v3": _read_deepseek_v3, "gpt_oss": _read_gpt_oss}


def _gemma3_rope(r: _Reader, where: str) -> tuple[float, float]:
    """(global theta, local theta) of a Gemma-3 config: rope_parameters keyed by layer type (transformers 5)
    or rope_theta + rope_local_base_freq (+ rope_scaling for the global layers) at the top (4.x)."""
    params = r.d.get("rope_parameters")
    if isinstance(params, dict) and {"full_attention", "sliding_attention"} & set(params):
        thetas = {}
        for kind, default in (("full_attention", 1e6), ("sliding_attention", 1e4)):
            sub = dict(params.get(kind) or {})
            d = {"rope_parameters": sub}
            thetas[kind] = _rope(d, where, r.notes) if sub else default
            if sub:
                r.notes[:] = [n.replace("rope_parameters", f"rope_parameters.{kind}") for n in r.notes]
        return thetas["full_attention"], thetas["sliding_attention"]
    theta = _rope(r.d, where, r.notes)
    local = r.d.get("rope_local_base_freq")
    return theta, (10000.0 if local is None else _float_field(where, "rope_local_base_freq", local))


def read_hf_config(d: dict, p: Path) -> ModelConfig:
    """The ``ModelConfig`` of a parsed Hugging Face config.json ``d`` (read from ``p``)."""
    where = f"model config {p}"
    if not isinstance(d, dict):
        raise RooflineError(f"{where} must hold a JSON object (a Hugging Face config.json), "
                            f"but it holds {show_value(d)}.")
    if isinstance(d.get("text_config"), dict) and "hidden_size" not in d:
        raise RooflineError(f"{where} is a multimodal config ({d.get('model_type')!r}): give its text model's "
                            "config (the text_config object saved as its own config.json).")
    mtype = d.get("model_type")
    if mtype is None:
        mtype = "llama"   # a bare Llama-style config (older tools write none): read as a Llama, and say so
        note = "config.json has no model_type: read as a Llama (model_type 'llama')."
    else:
        note = None
    if mtype in UNMODELLED_MOE:
        raise RooflineError(f"{where}: model_type {mtype!r} is a mixture of experts (or a hybrid), which is not "
                            f"modelled yet: supported are {', '.join(READERS)}.")
    if mtype not in READERS:
        raise RooflineError(f"{where}: model_type {show_value(mtype)} is not supported: supported are "
                            f"{', '.join(READERS)}.")
    missing = [k for k in _HF_REQUIRED if k not in d]
    if missing:
        raise RooflineError(f"{where} is missing the key {missing[0]!r} "
                            "(a config.json needs hidden_size, intermediate_size, "
                            "num_hidden_layers, num_attention_heads and vocab_size).")
    r = _Reader(d, where, mtype)
    if note:
        r.notes.append(note)
    q = d.get("quantization_config")
    if q is not None and mtype != "gpt_oss":   # GPT-OSS's reader says its own
        method = q.get("quant_method") if isinstance(q, dict) else q
        r.notes.append(f"quantization_config {method!r}: the published weights are quantized; costs use "
                       "--weight-dtype (give the dtype you serve), and only unquantized checkpoints load.")
    head_dim = d.get("head_dim")
    tie_default = mtype in ("gemma", "gemma2", "gemma3_text")   # transformers' own defaults per family
    raw = {
        "hidden": d["hidden_size"], "intermediate": d["intermediate_size"], "n_layers": d["num_hidden_layers"],
        "n_heads": d["num_attention_heads"], "n_kv_heads": r.get("num_key_value_heads", d["num_attention_heads"]),
        "vocab": d["vocab_size"], "max_context": r.get("max_position_embeddings", 4096),
        "head_dim": 0 if head_dim is None else _int_field(where, "head_dim", head_dim, 1, _HF_HINTS["head_dim"]),
        "rope_theta": 10000.0, "rms_eps": r.get("rms_norm_eps", 1e-6 if tie_default else 1e-5),
        "tie_embeddings": r.get("tie_word_embeddings", tie_default),
    }
    if mtype == "deepseek_v3":   # latent attention: a query/key head is nope + rope dims (its "head_dim" is rope's)
        raw["head_dim"] = sum(_int_field(where, k, d.get(k), 1) for k in ("qk_nope_head_dim", "qk_rope_head_dim"))
    values = _checked(raw, where, _HF_NAMES, _HF_HINTS)  # sizes first, so their errors come first
    _int_field(where, "num_hidden_layers", d["num_hidden_layers"])
    READERS[mtype](r)
    if mtype == "gemma3_text":
        values["rope_theta"], r.arch["rope_local_theta"] = _gemma3_rope(r, where)
    else:
        values["rope_theta"] = _rope(d, where, r.notes)
        yarn = _yarn(r, values["rope_theta"])
        if yarn:   # modelled (kernels.rope.rope_tables): not a note
            r.arch["rope_yarn"] = yarn
            r.notes[:] = [n for n in r.notes if '"yarn"' not in n]
    name = d.get("_name_or_path") or p.parent.name or mtype or "custom"
    ckpt = str(p.parent.resolve()) if any(p.parent.glob("*.safetensors")) else ""
    return ModelConfig(name=str(name), **values, **r.arch, checkpoint=ckpt, notes=tuple(r.notes))
