"""Nemotron-H (``model_type`` nemotron_h: NVIDIA's Nemotron-H and Nemotron-Nano-v2 hybrids; transformers 5.24,
configuration_nemotron_h.py / modeling_nemotron_h.py).

Every block is one pre-norm, one mixer and one residual: layers_block_type (or the published configs'
hybrid_override_pattern: M = linear_attention, a Mamba-2 mixer; * = full_attention; - = mlp; E = moe) says which
mixer. Our layer description keeps the block as a layer: a Mamba-2 or attention block is a layer with its mixer
and no MLP (``ModelConfig.no_mlp_layers``), an MLP block a layer of type "mlp" (no mixer). The attention applies
no RoPE (transformers' NemotronHAttention takes no position embeddings: ``nope_layers`` every attention layer)
and no bias; the MLP is up -> relu2 -> down (not gated). The Mamba-2 mixer: in_proj (use_bias) to z, x, B, C,
dt; the causal conv1d (use_conv_bias) over x, B, C; the SSD scan by chunk_size; the gated RMSNorm of y x silu(z)
in n_groups groups (norm_before_gate False); out_proj. An MoE block (E, an "mlp" layer of ``moe_layers``) routes as
DeepSeek-V3 does (sigmoid scores, e_score_correction_bias to choose, n_group / topk_group, norm_topk_prob,
routed_scaling_factor) to relu2 experts without a gate (up -> relu2 -> down) beside one shared expert of the same
form (moe_shared_expert_intermediate_size); the experts' latent projections (moe_latent_size) are refused.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import RooflineError
from .reader import HFReader, Keys
from .registry import Family, Tensors, register

_BLOCKS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}

# NemotronHConfig (transformers 5.24): every field with its default. num_hidden_layers is derived from the pattern
# (``_layer_count``); rms_norm_eps is not its key (layer_norm_epsilon is: every RMSNorm's epsilon); time_step_min is
# the prefill scan's lower clamp of dt (its mixer's time_step_limit is (time_step_min, inf); the config's own
# time_step_limit is read by no forward pass).
NEMOTRON_H_KEYS = Keys({
    "vocab_size": 131072, "hidden_size": 4096, "tie_word_embeddings": False, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096, "intermediate_size": 21504,
    "mlp_hidden_act": "relu2", "mlp_bias": False, "ssm_state_size": 128, "mamba_num_heads": 128,
    "mamba_head_dim": 64, "mamba_hidden_act": "silu", "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
    "use_conv_bias": True, "use_bias": False, "layers_block_type": None, "hybrid_override_pattern": None,
    "num_hidden_layers": None, "rms_norm_eps": None, "rope_theta": None,
    "n_routed_experts": 8, "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
    "num_experts_per_tok": 2, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
    "num_nextn_predict_layers": 0, "layer_norm_epsilon": 1e-5, "time_step_min": 0.001},
    numerics={"residual_in_fp32": (False, "keeps the residual stream in fp32 (transformers' model ignores it)")},
    refused={
        "sliding_window": ("a windowed attention layer (transformers' Nemotron-H attends over the whole context)",
                           (None,)),
        "mamba_ssm_cache_dtype": ("an SSM state held in another dtype than fp32", (None, "float32")),
        "moe_latent_size": ("the experts' latent projections (fc1_latent_proj, fc2_latent_proj)", (None,))},
    # attention_bias: transformers' NemotronHAttention has no bias whatever it says; mamba_proj_bias: unread (its
    # in_proj and out_proj take use_bias); expand and the time_step_* init ranges: unread by the forward pass;
    # n_shared_experts: its MoE block has one shared expert whatever it says; moe_shared_expert_overlap: a
    # scheduling hint; the published configs' norm_eps (layer_norm_epsilon's twin) and partial_rotary_factor (its
    # attention applies no RoPE) are read by no transformers code
    irrelevant=("n_shared_experts", "moe_shared_expert_overlap", "norm_eps", "partial_rotary_factor",
                "attention_bias", "mamba_proj_bias", "expand", "time_step_max", "time_step_floor", "time_step_limit",
                "use_mamba_kernels", "num_logits_to_keep", "hidden_dropout", "rescale_prenorm_residual",
                "mtp_layers_block_type", "mtp_hybrid_override_pattern"))


def _blocks(d: dict, where: str) -> list:
    """The block types, from layers_block_type or (the published configs) hybrid_override_pattern."""
    lt = d.get("layers_block_type")
    if lt is None and d.get("hybrid_override_pattern") is not None:
        pat = d["hybrid_override_pattern"]
        if not isinstance(pat, str) or not pat or any(c not in _BLOCKS for c in pat):
            raise RooflineError(f"{where}: nemotron_h: hybrid_override_pattern = {pat!r} is not a pattern of "
                                "M, *, - and E (one per block): fix it.")
        lt = [_BLOCKS[c] for c in pat]
    if lt is None:      # NemotronHConfig's default
        lt = ["linear_attention", "moe", "full_attention", "mlp"]
    if not isinstance(lt, list) or not lt or any(t not in _BLOCKS.values() for t in lt):
        raise RooflineError(f"{where}: nemotron_h: layers_block_type = {lt!r} is not a list of "
                            f"{', '.join(_BLOCKS.values())} (one per block): fix it.")
    return lt


def _layer_count(d: dict, where: str) -> dict:
    """NemotronHConfig derives num_hidden_layers from the blocks (a config it saves has none): fill it in."""
    n = len(_blocks(d, where))
    if d.get("num_hidden_layers") not in (None, n):
        raise RooflineError(f"{where}: nemotron_h: num_hidden_layers = {d['num_hidden_layers']!r} but the pattern "
                            f"has {n} blocks: give one block per layer.")
    return {**d, "num_hidden_layers": n}


def read_nemotron_h(r: HFReader) -> None:
    blocks = _blocks(r.d, r.where)
    r.expect("mlp_hidden_act", ("relu2",), "relu2")
    r.expect("mamba_hidden_act", ("silu",), "silu")
    if r.get("num_nextn_predict_layers", 0):
        r.notes.append(f"num_nextn_predict_layers = {r.d['num_nextn_predict_layers']}: the multi-token-prediction "
                       "layers are not part of a step (not costed, not loaded).")
    kinds = {"linear_attention": "mamba", "full_attention": "full", "mlp": "mlp", "moe": "mlp"}
    types = tuple(kinds[t] for t in blocks)
    heads, groups = r.count("mamba_num_heads", 128), r.count("n_groups", 8)
    if heads % groups:
        r.refuse("n_groups", f"does not divide mamba_num_heads {heads}")
    r.arch.update(
        activation="relu2", mlp_bias=r.flag("mlp_bias"), layer_types=types,
        nope_layers=tuple(i for i, t in enumerate(types) if t == "full"),
        no_mlp_layers=tuple(i for i, t in enumerate(types) if t != "mlp"),
        mamba_heads=heads, mamba_head_dim=r.count("mamba_head_dim", 64), mamba_state=r.count("ssm_state_size", 128),
        mamba_groups=groups, mamba_conv=r.count("conv_kernel", 4), mamba_chunk=r.count("chunk_size", 128),
        mamba_conv_bias=r.flag("use_conv_bias", True), mamba_proj_bias=r.flag("use_bias"),
        rms_eps=r.number("layer_norm_epsilon") or 1e-5, mamba_dt_min=r.number("time_step_min"))
    if "moe" in blocks:     # DeepSeek-V3's sigmoid routing (correction bias, groups, scale) over relu2 experts
        r.arch.update(
            n_experts=r.experts("n_routed_experts"), n_active=r.count("num_experts_per_tok", 2),
            moe_intermediate=r.count("moe_intermediate_size", 7688), router="sigmoid_group",
            norm_topk=r.flag("norm_topk_prob", True), routed_scale=r.number("routed_scaling_factor") or 1.0,
            n_group=r.count("n_group", 1), topk_group=r.count("topk_group", 1), router_correction=True,
            expert_activation="relu2", shared_intermediate=r.count("moe_shared_expert_intermediate_size", 7688),
            dense_layers=tuple(i for i, t in enumerate(blocks) if t == "mlp"))


_RENAME = (("input_layernorm.", "norm."), ("post_attention_layernorm.", "norm."), ("self_attn.", "mixer."),
           ("mamba.", "mixer."), ("mlp.", "mixer."), ("model.embed_tokens.", "model.embeddings."),
           ("model.norm.", "model.norm_f."))


def _names(cfg, sh, ops: list) -> list:
    """Nemotron-H's tensor names: each block's one norm (``norm``) and its mixer (``mixer.``), the embedding
    ``model.embeddings``, the final norm ``model.norm_f``."""
    def hf(name: str) -> str:
        for a, b in _RENAME:
            if name.startswith(a):
                return b + name[len(a):]
        return name
    return [replace(o, weights=tuple(replace(w, hf=hf(w.hf)) for w in o.weights)) for o in ops]


# the MoE block's tensors (renamed from mlp. to mixer. by ``_names``); the experts one up_proj and one down_proj each
# (the checkpoints' layout, what save_pretrained writes; no gate); the decoder under backbone. (kernels.checkpoint)
NEMOTRON_H_TENSORS = Tensors(moe=dict(router="mlp.gate.weight", correction="mlp.gate.e_score_correction_bias",
                                      gate="mlp.experts.{e}.up_proj.weight", up="mlp.experts.{e}.up_proj.weight",
                                      down="mlp.experts.{e}.down_proj.weight", shared="mlp.shared_experts."))

register(Family("nemotron_h", read_nemotron_h, tensors=NEMOTRON_H_TENSORS, keys=NEMOTRON_H_KEYS, edit_ops=_names,
                normalize=_layer_count))
