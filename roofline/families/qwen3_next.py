"""Qwen3-Next and Qwen3.5 (``model_type`` qwen3_next; qwen3_5_text / qwen3_5_moe_text, the text models of the
qwen3_5 / qwen3_5_moe wrappers): hybrids of Gated DeltaNet linear attention and gated full attention
(transformers 5.24, modeling_qwen3_next.py / modeling_qwen3_5.py / modeling_qwen3_5_moe.py).

``layer_types`` (or, absent, ``full_attention_interval``: every 4th layer full) says which layers attend; the
others run Gated DeltaNet (``ModelConfig.linear_*``: its heads, widths and conv kernel; ``roofline.layer``'s
DeltaNet ops). The full-attention layers are Qwen3's qk-norm GQA with a doubled q_proj whose second half gates
the output (x sigmoid: ``attn_gate``), RoPE on the first partial_rotary_factor (default 0.25) of each head. Every
RMSNorm but the DeltaNet's gated one multiplies by (1 + w) (``norm_offset``). Qwen3-Next's MLP is routed experts
(softmax top-k, norm_topk_prob) with a sigmoid-gated shared expert on the layers mlp_only_layers and
decoder_sparse_step leave sparse, a dense one elsewhere; Qwen3.5's is dense; Qwen3.5-MoE's routed on every layer
(always renormalised). Qwen3.5's mrope (rope_parameters.mrope_section) rotates text positions as plain RoPE: a
text-only step is costed. Qwen3-Next fuses DeltaNet's projections in two (in_proj_qkvz, in_proj_ba), Qwen3.5
keeps four (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).
"""

from __future__ import annotations

from ..errors import RooflineError
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys, rotary_dim
from .registry import Family, Tensors, preset, register

_MOE = dict(router="mlp.gate.weight", gate="mlp.experts.{e}.gate_proj.weight", up="mlp.experts.{e}.up_proj.weight",
            down="mlp.experts.{e}.down_proj.weight", shared="mlp.shared_expert.",
            shared_gate="mlp.shared_expert_gate.weight")
QWEN3_NEXT_TENSORS = Tensors(moe=_MOE)
QWEN3_5_TENSORS = Tensors(moe=_MOE, deltanet=(("in_proj_qkv", "qkv"), ("in_proj_z", "z"), ("in_proj_b", "b"),
                                              ("in_proj_a", "a")))

# What every one of the three config classes has (Qwen3NextConfig's defaults; the sizes are each class's own).
_HYBRID_KEYS = LLAMA_LIKE_KEYS + Keys({
    "attention_bias": False, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "layer_types": None, "full_attention_interval": 4,
    "partial_rotary_factor": None},
    refused={
        # the published configs say these; transformers' classes do not (its model always gates, keeps no MTP)
        "attn_output_gate": ("attention without its output gate (transformers' Qwen3-Next always gates)",
                             (None, True)),
        "mamba_ssm_dtype": ("a recurrent state held in another dtype than fp32", (None, "float32"))},
    irrelevant=("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"))
_ROUTED_KEYS = Keys({"moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts": None})
# the published Qwen3-Next configs also say use_sliding_window (false), which Qwen3NextConfig does not read
QWEN3_NEXT_KEYS = _HYBRID_KEYS + _ROUTED_KEYS + Keys({
    **sizes(151936, 2048, 5632, 48, 16, 2, 32768, 1e-6, head_dim=256), "num_experts": 512,
    "num_experts_per_tok": 10, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": None},
    refused={"use_sliding_window": ("a sliding window (transformers' Qwen3-Next attends over the whole context)",
                                    (None, False))})
# Qwen3.5's published configs give its mrope in rope_parameters (mrope_section, mrope_interleaved): for text, every
# section sees the same position, so it rotates as plain RoPE
_MROPE = Keys(rope=("mrope_section", "mrope_interleaved"))
QWEN3_5_KEYS = _HYBRID_KEYS + _MROPE + Keys(sizes(248320, 4096, 12288, 32, 16, 4, 32768, 1e-6, head_dim=256))
# Qwen3.5-MoE has no dense MLP and no intermediate_size (irrelevant: a bare config need not give it): 512 (its
# experts' width) fills ModelConfig.intermediate, which no op of a model routed on every layer reads
# its published configs (as transformers prints them) say mlp_only_layers [], which Qwen3_5MoeTextConfig does not read
QWEN3_5_MOE_KEYS = _HYBRID_KEYS + _MROPE + _ROUTED_KEYS + Keys({
    **sizes(248320, 2048, 512, 40, 16, 2, 32768, 1e-6, head_dim=256), "num_experts": 256, "num_experts_per_tok": 8},
    refused={"mlp_only_layers": ("dense MLP layers (transformers' Qwen3.5-MoE routes every layer)", (None, []))},
    irrelevant=("intermediate_size",))


def _layer_types(r: HFReader) -> tuple:
    """"linear" or "full" per layer: layer_types (linear_attention / full_attention), else every
    full_attention_interval-th layer full (transformers' default)."""
    n = r.d["num_hidden_layers"]
    lt = r.d.get("layer_types")
    if lt is None:
        k = r.count("full_attention_interval", 4)
        return tuple("full" if (i + 1) % k == 0 else "linear" for i in range(n))
    kinds = {"linear_attention": "linear", "full_attention": "full"}
    if not isinstance(lt, list) or any(t not in kinds for t in lt):
        r.refuse("layer_types", "is not modelled (supported: linear_attention, full_attention per layer)")
    if len(lt) != n:
        raise RooflineError(f"{r.where}: layer_types has {len(lt)} entries for num_hidden_layers {n}: give one per "
                            "layer.")
    return tuple(kinds[t] for t in lt)


def _hybrid(r: HFReader) -> None:
    """What the three share: Gated DeltaNet's sizes and layers, the gated qk-norm attention, (1 + w) norms."""
    llama_like(r, partial_rotary=True)
    hd = r.d.get("head_dim") or r.d["hidden_size"] // r.d["num_attention_heads"]
    bias = r.flag("attention_bias")
    r.arch.update(
        qkv_bias=bias, o_bias=bias, qk_norm=True, norm_offset=True, attn_gate=True,
        rotary_dim=rotary_dim(r, hd, 0.25), layer_types=_layer_types(r),
        linear_k_heads=r.count("linear_num_key_heads", 16), linear_v_heads=r.count("linear_num_value_heads", 32),
        linear_k_dim=r.count("linear_key_head_dim", 128), linear_v_dim=r.count("linear_value_head_dim", 128),
        linear_conv=r.count("linear_conv_kernel_dim", 4))
    if r.get("mtp_num_hidden_layers", 0):
        r.notes.append(f"mtp_num_hidden_layers = {r.d['mtp_num_hidden_layers']}: the multi-token-prediction layer "
                       "is not part of a step (not costed, not loaded).")


def _routed(r: HFReader, n_active: int, dense: tuple) -> None:
    r.arch.update(n_experts=r.experts("num_experts"), n_active=r.count("num_experts_per_tok", n_active),
                  moe_intermediate=r.size("moe_intermediate_size"), router="softmax_topk",
                  shared_intermediate=r.count("shared_expert_intermediate_size", 512, 0), dense_layers=dense)
    r.arch["shared_gate"] = bool(r.arch["shared_intermediate"])


def read_qwen3_next(r: HFReader) -> None:
    _hybrid(r)
    n = r.d["num_hidden_layers"]
    if not r.get("num_experts", 512):      # no experts: every layer's MLP is dense
        return
    step = r.count("decoder_sparse_step", 1)
    only = r.get("mlp_only_layers", [])
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        r.refuse("mlp_only_layers", "must list layer indices")
    _routed(r, 10, tuple(i for i in range(n) if i in only or (i + 1) % step))
    r.arch["norm_topk"] = r.flag("norm_topk_prob", True)


def read_qwen3_5(r: HFReader) -> None:
    _hybrid(r)


def read_qwen3_5_moe(r: HFReader) -> None:
    _hybrid(r)
    _routed(r, 8, ())
    r.arch["norm_topk"] = True


_VISION = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")

def _hybrid_preset(name, hidden, intermediate, layers, heads, vocab, v_heads, experts, active, width, source):
    """Qwen3-Next and Qwen3.5-MoE's published shape: 2 KV heads of 256, a full-attention layer after every three
    Gated DeltaNet ones (16 key heads of 128, value heads of 128, a 4-wide conv), RoPE base 1e7 on a quarter of
    each head, 262,144 positions; ``experts`` routed experts and one sigmoid-gated shared expert, all ``width``
    wide, on every layer."""
    return preset(name, hidden, intermediate, layers, heads, 2, vocab, 262144, head_dim=256, rope_theta=1e7,
                  rms_eps=1e-6, qk_norm=True, norm_offset=True, attn_gate=True, rotary_dim=64,
                  layer_types=("linear", "linear", "linear", "full") * (layers // 4), linear_k_heads=16,
                  linear_v_heads=v_heads, linear_k_dim=128, linear_v_dim=128, linear_conv=4, n_experts=experts,
                  n_active=active, moe_intermediate=width, shared_intermediate=width, shared_gate=True,
                  source=source)


_CITED = " (tests/data/hf_configs/hybrid/, its README citing the public copies it was read from)"

register(Family("qwen3_next", read_qwen3_next, tensors=QWEN3_NEXT_TENSORS, keys=QWEN3_NEXT_KEYS, presets=(
    _hybrid_preset("qwen3-next-80b-a3b", 2048, 5120, 48, 16, 151936, 32, 512, 10, 512,
                   "Qwen/Qwen3-Next-80B-A3B-Instruct's config.json" + _CITED + ": 48 layers, 36 Gated DeltaNet "
                   "(32 value heads) and 12 gated full-attention (16 heads), 512 experts of 512, top-10, a "
                   "shared expert; 79.67B parameters (transformers' count), its MTP layer not part of a step"),
)))
register(Family("qwen3_5_text", read_qwen3_5, tensors=QWEN3_5_TENSORS, keys=QWEN3_5_KEYS, wrappers={
    "qwen3_5": {"what": "Qwen3.5, Qwen3_5ForConditionalGeneration", "tie_word_embeddings": False, "vision": _VISION}}))
register(Family("qwen3_5_moe_text", read_qwen3_5_moe, tensors=QWEN3_5_TENSORS, keys=QWEN3_5_MOE_KEYS, wrappers={
    "qwen3_5_moe": {"what": "Qwen3.5-MoE, Qwen3_5MoeForConditionalGeneration", "tie_word_embeddings": False,
                    "vision": _VISION}}, presets=(
    # 512: transformers' intermediate_size, which no op of a model routed on every layer reads
    _hybrid_preset("qwen3.5-397b-a17b", 4096, 512, 60, 32, 248320, 64, 512, 10, 1024,
                   "Qwen/Qwen3.5-397B-A17B's text model" + _CITED + ": 60 layers, 45 Gated DeltaNet (64 value "
                   "heads) and 15 gated full-attention (32 heads), 512 experts of 1,024, top-10, a shared expert "
                   "of 1,024; its mrope rotates text as plain RoPE; 396.35B text parameters (transformers' count), "
                   "the vision tower and the MTP layer not costed"),
    _hybrid_preset("qwen3.6-35b-a3b", 2048, 512, 40, 16, 248320, 32, 256, 8, 512,
                   "Qwen/Qwen3.6-35B-A3B's text model" + _CITED + ": 40 layers, 30 Gated DeltaNet and 10 gated "
                   "full-attention (16 heads), 256 experts of 512, top-8, a shared expert; 34.66B text parameters "
                   "(transformers' count, and the checkpoint's own inventory), the vision tower and the MTP layer "
                   "not costed"),
)))
