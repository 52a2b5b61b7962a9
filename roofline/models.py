"""The model description (``ModelConfig``), ``PRESETS`` and ``load_model``.

Nothing is downloaded: ``load_model`` takes a preset name or a path to a local config.json, which is read
through the family of its ``model_type`` (``roofline.families``: one file per family, registered by
model_type, holding its reader, its checkpoint's tensor names and its presets with their sources). The
toy presets (tiny, small, tiny-moe, tiny-mla) are here. A parameter count is ``roofline.layer.model_params``
(every weight the model's ops read).

Every input is checked where it enters, in one place (``roofline.config_fields.check_sizes``, used by
``ModelConfig.__post_init__`` -- hence by ``from_dict`` -- and by the config.json reader),
and a bad one is a one-line ``RooflineError`` naming the field, the value, the rule and
what to do. What the model does not implement (RoPE scaling) is kept as a sentence in
``ModelConfig.notes``, never silently dropped.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, asdict, dataclass, field, replace
from pathlib import Path

from .config_fields import (MAX_SIZES, SIZE_FIELDS, bool_field, bounded, check_sizes, float_field, int_field,
                            read_json_file, show_value)
from .errors import RooflineError, did_you_mean
from .families import presets, read_hf_config
from .precision import Quantization

# Field names and hints as a user of the dataclass sees them.
_OWN_NAMES = {f: f for f in SIZE_FIELDS}
_OWN_HINTS = {"head_dim": " (0 means hidden / n_heads)"}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int            # d_model
    intermediate: int      # SwiGLU inner width
    n_layers: int
    n_heads: int           # query heads
    n_kv_heads: int        # key/value heads (GQA when < n_heads)
    vocab: int
    max_context: int       # max_position_embeddings
    head_dim: int = 0      # 0: hidden // n_heads (which must then divide exactly); always even (RoPE)
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    # ---- architecture (roofline.families reads these from a config.json per model_type; the
    # defaults are a Llama). Each changes cost or numerics and is modelled by roofline.layer's ops.
    arch: str = "llama"            # the Hugging Face model_type the config was read as
    qkv_bias: bool = False         # biases on q/k/v_proj (Qwen2; Llama's attention_bias)
    o_bias: bool = False           # a bias on o_proj (Llama's attention_bias)
    mlp_bias: bool = False         # biases on gate/up/down_proj (Llama's mlp_bias)
    qk_norm: bool = False          # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma-3)
    activation: str = "silu"       # the MLP's activation: "silu" (SwiGLU), "gelu_tanh" (GeGLU), "relu2" (no gate)
    norm_offset: bool = False      # RMSNorm multiplies by (1 + w) (Gemma): numerics only
    sandwich_norms: bool = False   # norms after attention and after the MLP too (Gemma-2/3: four per layer)
    embed_scale: bool = False      # embeddings multiplied by sqrt(hidden) (Gemma)
    query_scale: float = 0.0       # attention's score scale; 0: 1/sqrt(head_dim) (Gemma-2/3: query_pre_attn_scalar**-0.5)
    attn_softcap: float = 0.0      # scores -> c * tanh(scores / c) (Gemma-2); 0: none
    final_softcap: float = 0.0     # logits -> c * tanh(logits / c) (Gemma-2); 0: none
    sliding_window: int = 0        # keys a windowed layer's query sees (itself included); 0: no window
    layer_types: tuple = ()        # per layer, one of LAYER_TYPES (below); () with a window: every layer slides
    attention_chunk: int = 0       # chunked local attention: a "chunked" layer's query sees only its own chunk's keys
                                   # (positions cut into chunks of this many, causal within; Llama-4); 0: none
    rope_local_theta: float = 0.0  # plain RoPE base of the sliding layers (Gemma-3; OLMo-3: no YaRN); 0: the full's
    nope_layers: tuple = ()        # layers that apply no RoPE to q and k (NoPE: SmolLM3's every 4th)
    pre_norms: bool = True         # a norm before attention and before the MLP; False: only after them (OLMo-2)
    qk_norm_whole: bool = False    # qk-norm over the whole q / k projection, not each head's (OLMo-2)
    qk_l2_norm: bool = False       # a weightless RMS norm over each head's q and k after RoPE, RoPE layers only (Llama-4)
    attn_temperature: tuple = ()   # (floor_scale, attn_scale): NoPE layers' queries x 1 + attn_scale * log1p(floor((pos
                                   # + 1) / floor_scale)) (Llama-4's attn_temperature_tuning); (): none
    rotary_dim: int = 0            # partial rotary: RoPE on each head's first rotary_dim dims (GLM-4.5's half); 0: all
    embed_multiplier: float = 0.0  # the embedding x this (Granite's embedding_multiplier); 0: none
    residual_multiplier: float = 0.0  # each residual adds the branch x this (Granite); 0: plain add
    logits_scaling: float = 0.0    # the logits / this (Granite's logits_scaling); 0: none
    rope_yarn: tuple = ()          # YaRN: (factor, beta_fast, beta_slow, original max positions, attention factor,
                                   # truncate) as kernels.rope.rope_tables takes it (GPT-OSS, DeepSeek-V3)
    attn_sinks: bool = False       # a learned logit per query head in every softmax's denominator (GPT-OSS)
    # ---- mixture of experts (roofline.layer: router, experts, shared_* ops; 0 experts: a dense model)
    n_experts: int = 0             # routed experts per MoE layer
    n_active: int = 0              # experts each token is routed to (top-k)
    moe_intermediate: int = 0      # one routed expert's intermediate width
    router: str = "softmax_topk"   # softmax_topk (Mixtral, Qwen), topk_softmax (GPT-OSS), sigmoid_group (DeepSeek),
                                   # sigmoid_topk (Llama-4: top-k of the logits, their sigmoids)
    routed_input: bool = False     # the routing weight scales each expert's input, not its output (Llama-4)
    norm_topk: bool = True         # renormalise the k routing weights to sum to 1
    routed_scale: float = 1.0      # routing weights x this (DeepSeek's routed_scaling_factor)
    n_group: int = 1               # DeepSeek: expert groups, of which topk_group are kept per token
    topk_group: int = 1
    router_bias: bool = False      # a bias on the router GEMM (GPT-OSS)
    router_correction: bool = False  # DeepSeek's e_score_correction_bias (added to choose, not to weigh)
    expert_bias: bool = False      # biases on every expert's projections (GPT-OSS)
    expert_activation: str = "silu"  # silu (SwiGLU), swiglu_oai (GPT-OSS: clamped, alpha 1.702, up + 1) or relu2
                                     # (Nemotron-H: no gate, up -> relu2 -> down; its shared expert too)
    shared_intermediate: int = 0   # width of the shared expert(s) every token runs (Qwen2-MoE, DeepSeek)
    shared_gate: bool = False      # the shared expert's output x sigmoid(a [H, 1] gate) (Qwen2-MoE)
    dense_layers: tuple = ()       # layers of an MoE model that keep a dense MLP (DeepSeek's first 3)
    # ---- Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): the layers layer_types names "linear"
    linear_k_heads: int = 0        # linear_num_key_heads: q and k heads of a DeltaNet layer
    linear_v_heads: int = 0        # linear_num_value_heads: v heads (each q/k head serves v / k of them)
    linear_k_dim: int = 0          # linear_key_head_dim
    linear_v_dim: int = 0          # linear_value_head_dim
    linear_conv: int = 0           # linear_conv_kernel_dim: the causal depthwise conv1d's kernel over q, k, v
    attn_gate: bool = False        # q_proj's output doubled: attention output x sigmoid(gate) (attn_output_gate)
    # ---- Mamba-2 (Nemotron-H, Granite-4.0-H): the layers layer_types names "mamba"
    mamba_heads: int = 0           # mamba_num_heads: SSM heads (the scan runs per head)
    mamba_head_dim: int = 0        # mamba_head_dim: each head's channels (heads x this = the inner width)
    mamba_state: int = 0           # ssm_state_size: d_state
    mamba_groups: int = 0          # n_groups: B and C groups (shared by heads / groups heads); the gated norm's groups
    mamba_conv: int = 0            # conv_kernel: the causal depthwise conv1d's kernel over x, B, C
    mamba_chunk: int = 0           # chunk_size: the SSD scan's chunk in prefill
    mamba_conv_bias: bool = False  # a bias on the conv1d (use_conv_bias)
    mamba_proj_bias: bool = False  # biases on in_proj and out_proj (use_bias / mamba_proj_bias)
    mamba_norm: bool = True        # the gated RMSNorm of y by z; False: y x silu(z) alone (Falcon-H1's mamba_rms_norm)
    mamba_norm_first: bool = False  # the gated norm's order: norm(y) x silu(z) (Falcon-H1's mamba_norm_before_gate);
                                    # False: norm(y x silu(z)) (Nemotron-H, Granite-4.0-H); the same work either way
    mamba_dt_min: float = 0.0      # the prefill scan clamps softplus(dt + dt_bias) to [min, max] (transformers'
    mamba_dt_max: float = 0.0      # time_step_limit; Nemotron-H's (time_step_min, inf)); 0: no bound; numerics only
    # layers with a mixer (attention, DeltaNet, Mamba) and no MLP (Nemotron-H's "M" and "*" blocks); layer_types
    # "mlp" names the layers with an MLP and no mixer (its "-" blocks)
    no_mlp_layers: tuple = ()
    # per-layer multipliers a family's edit_ops places as scale ops: (name, factor or factors) (Falcon-H1's muP)
    layer_scales: tuple = ()
    # ---- multi-head latent attention (DeepSeek): kv_lora_rank > 0
    q_lora_rank: int = 0           # 0: q = x W_q directly
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    qk_nope_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False  # rope dims stored interleaved (DeepSeek; ERNIE's q/k): loaded de-interleaved
    # ---- multi-token prediction (DeepSeek-V3, GLM-4.5: num_nextn_predict_layers): not part of a step; a
    # speculative draft (roofline.speculative: one decoder layer + its projections, with its own weights and KV)
    mtp_layers: int = 0
    # ---- DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): MLA over the index_topk tokens an indexer selects
    index_topk: int = 0            # 0: dense MLA
    index_n_heads: int = 0         # the indexer's query heads
    index_head_dim: int = 0        # its query/key width (RoPE on its first qk_rope_dim)
    index_shared: tuple = ()       # layers with no indexer of their own: the previous one's selection (GLM-5)
    index_rope_interleave: bool = False  # the indexer's rope dims rotated as interleaved pairs (GLM-5): loaded
                                         # de-interleaved, as rope_interleave
    # How the checkpoint stores its weights (roofline.precision.checkpoint: its quantization_config or ModelOpt's
    # hf_quant_config.json, read by the family reader); None: unquantized. roofline.layer.precision_of resolves it.
    quantization: Quantization | None = None
    # The folder of the checkpoint's *.safetensors when the config came with weights ("": random weights).
    checkpoint: str = field(default="", compare=False)
    # Sentences about what the config holds and the model does not implement (e.g. RoPE scaling).
    notes: tuple = field(default=(), compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise RooflineError(f"model description: name must be a string, but {show_value(self.name)} was given.")
        where = f"model {self.name!r}"
        values = check_sizes({f: getattr(self, f) for f in SIZE_FIELDS}, where, _OWN_NAMES, _OWN_HINTS)
        for k, v in values.items():
            object.__setattr__(self, k, v)
        notes = self.notes
        if not isinstance(notes, (list, tuple)) or not all(isinstance(n, str) for n in notes):
            raise RooflineError(f"{where}: notes must be a list of sentences (strings), but {show_value(notes)} "
                                "was given.")
        object.__setattr__(self, "notes", tuple(notes))
        object.__setattr__(self, "quantization", Quantization.from_dict(self.quantization))
        _check_arch(self, where)

    @property
    def windows(self) -> tuple:
        """Each layer's attention window in keys (0: full attention), from sliding_window and layer_types."""
        if not self.sliding_window:
            return (0,) * self.n_layers
        if not self.layer_types:
            return (self.sliding_window,) * self.n_layers
        return tuple(self.sliding_window if t == "sliding" else 0 for t in self.layer_types)

    @property
    def attention_layers(self) -> tuple:
        """The layer indices that attend over a KV cache (every layer but the DeltaNet, Mamba and MLP-only ones)."""
        return tuple(i for i in range(self.n_layers)
                     if not self.layer_types or self.layer_types[i] not in ("linear", "mamba", "mlp"))

    @property
    def mamba_layers(self) -> tuple:
        """The layer indices of Mamba-2 (layer_types "mamba", or "hybrid": beside attention; none for most models)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t in ("mamba", "hybrid"))

    @property
    def mixer_layers(self) -> tuple:
        """The layers with a mixer (attention, DeltaNet or Mamba) and its norm and residual: all but "mlp" ones."""
        return tuple(i for i in range(self.n_layers) if not self.layer_types or self.layer_types[i] != "mlp")

    @property
    def mlp_layers(self) -> tuple:
        """The layers with an MLP (dense or routed) and its norm and residual: all but ``no_mlp_layers``."""
        return tuple(i for i in range(self.n_layers) if i not in self.no_mlp_layers)

    @property
    def linear_layers(self) -> tuple:
        """The layer indices of Gated DeltaNet linear attention (layer_types "linear"; none for most models)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear")

    @property
    def chunks(self) -> tuple:
        """Each layer's attention chunk in positions (0: not chunked), from attention_chunk and layer_types."""
        if not self.attention_chunk:
            return (0,) * self.n_layers
        if not self.layer_types:
            return (self.attention_chunk,) * self.n_layers
        return tuple(self.attention_chunk if t == "chunked" else 0 for t in self.layer_types)

    @property
    def index_layers(self) -> tuple:
        """The layer indices that run a DSA indexer of their own (none for a dense-attention model)."""
        return tuple(i for i in range(self.n_layers) if i not in self.index_shared) if self.index_topk else ()

    @property
    def moe_layers(self) -> tuple:
        """The layer indices whose MLP is a mixture of experts (none for a dense model)."""
        if not self.n_experts:
            return ()
        return tuple(i for i in self.mlp_layers if i not in self.dense_layers)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def scale(self) -> float:
        """The attention score scale (1/sqrt(head_dim) unless the config gives another)."""
        return self.query_scale or 1.0 / math.sqrt(self.head_dim)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def with_layers(self, n_layers: int) -> "ModelConfig":
        types = self.layer_types
        if types:   # keep the pattern: the first n_layers layers' types
            types = tuple(types[i % len(types)] for i in range(n_layers))
        dense = tuple(i for i in self.dense_layers if i < n_layers)
        nope = tuple(i for i in self.nope_layers if i < n_layers)
        no_mlp = tuple(i for i in self.no_mlp_layers if i < n_layers)
        shared = tuple(i for i in self.index_shared if i < n_layers)
        return replace(self, n_layers=n_layers, layer_types=types, dense_layers=dense, nope_layers=nope,
                       no_mlp_layers=no_mlp, index_shared=shared, name=f"{self.name} ({n_layers} layers)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["layer_types"] = list(self.layer_types)
        d["dense_layers"] = list(self.dense_layers)
        d["nope_layers"] = list(self.nope_layers)
        d["no_mlp_layers"] = list(self.no_mlp_layers)
        d["rope_yarn"] = list(self.rope_yarn)
        d["attn_temperature"] = list(self.attn_temperature)
        d["quantization"] = self.quantization.to_dict() if self.quantization else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """The inverse of ``to_dict`` (result-file headers): unknown keys are ignored, bad values are errors."""
        if not isinstance(d, dict):
            raise RooflineError(f"model description must be a JSON object (as ModelConfig.to_dict() writes), "
                                f"but {show_value(d)} was given.")
        required = [f.name for f in cls.__dataclass_fields__.values()
                    if f.default is MISSING and f.default_factory is MISSING]
        missing = [k for k in required if k not in d]
        if missing:
            raise RooflineError(f"model description {d.get('name', '')!r} is missing the key {missing[0]!r} "
                                f"(it needs {', '.join(required)}).")
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        for k in ("layer_types", "dense_layers", "nope_layers", "no_mlp_layers", "rope_yarn", "attn_temperature"):
            if isinstance(kw.get(k), list):
                kw[k] = tuple(kw[k])
        if isinstance(kw.get("layer_scales"), list):
            kw["layer_scales"] = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in kw["layer_scales"])
        return cls(**kw)


ACTIVATIONS = ("silu", "gelu_tanh", "relu2")   # relu2: relu(x)^2, not gated (Nemotron-H's up -> down MLP)
# per layer: attention (full, sliding or chunked), Gated DeltaNet, Mamba-2, full attention and Mamba-2 side by side
# (their outputs summed: Falcon-H1), or no mixer (an MLP-only layer)
LAYER_TYPES = ("full", "sliding", "chunked", "linear", "mamba", "hybrid", "mlp")
ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_group", "sigmoid_topk")


def _check_arch(m: "ModelConfig", where: str) -> None:
    """The architecture fields' rules (one line each, like the sizes')."""
    if m.activation not in ACTIVATIONS:
        raise RooflineError(f"{where}: activation must be one of {', '.join(ACTIVATIONS)}, but "
                            f"{show_value(m.activation)} was given.")
    for name in ("qkv_bias", "o_bias", "mlp_bias", "qk_norm", "norm_offset", "sandwich_norms", "embed_scale",
                 "attn_sinks", "norm_topk", "router_bias", "router_correction", "expert_bias", "shared_gate",
                 "rope_interleave", "index_rope_interleave", "pre_norms", "qk_norm_whole", "attn_gate", "qk_l2_norm",
                 "routed_input", "mamba_conv_bias", "mamba_proj_bias", "mamba_norm", "mamba_norm_first"):
        bool_field(where, name, getattr(m, name))
    for name in ("query_scale", "attn_softcap", "final_softcap", "rope_local_theta", "embed_multiplier",
                 "residual_multiplier", "logits_scaling"):
        v = getattr(m, name)
        if v != 0:
            object.__setattr__(m, name, float_field(where, name, v, " (0 means none)"))
    object.__setattr__(m, "sliding_window", int_field(where, "sliding_window", m.sliding_window, 0,
                                                       " (0 means no window)"))
    object.__setattr__(m, "attention_chunk", int_field(where, "attention_chunk", m.attention_chunk, 0,
                                                        " (0 means no chunked attention)"))
    types = m.layer_types
    if not isinstance(types, (list, tuple)) or any(t not in LAYER_TYPES for t in types):
        raise RooflineError(f"{where}: layer_types must be a list of {', '.join(LAYER_TYPES)} per layer, but "
                            f"{show_value(types)} was given.")
    if types and len(types) != m.n_layers:
        raise RooflineError(f"{where}: layer_types has {len(types)} entries for {m.n_layers} layers: give one per "
                            "layer.")
    if "sliding" in types and not m.sliding_window:
        raise RooflineError(f"{where}: layer_types has sliding layers but sliding_window is 0: give the window.")
    if "chunked" in types and not m.attention_chunk:
        raise RooflineError(f"{where}: layer_types has chunked layers but attention_chunk is 0: give the chunk.")
    if m.attention_chunk and m.sliding_window:
        raise RooflineError(f"{where}: attention_chunk and sliding_window are both set: a model has one or the "
                            "other (give 0 for the one it lacks).")
    temp = m.attn_temperature
    if not isinstance(temp, (list, tuple)) or len(temp) not in (0, 2) or (temp and (
            isinstance(temp[0], bool) or not isinstance(temp[0], int) or temp[0] < 1)):
        raise RooflineError(f"{where}: attn_temperature must be (floor_scale, attn_scale), floor_scale a whole "
                            f"number of at least 1, or empty, but {show_value(temp)} was given.")
    object.__setattr__(m, "attn_temperature", (temp[0], float_field(where, "attn_temperature[1]", temp[1]))
                       if temp else ())
    object.__setattr__(m, "layer_types", tuple(types))
    _check_linear(m, where)
    _check_mamba(m, where)
    if m.router not in ROUTERS:
        raise RooflineError(f"{where}: router must be one of {', '.join(ROUTERS)}, but {show_value(m.router)} was given.")
    if m.expert_activation not in ("silu", "swiglu_oai", "relu2"):
        raise RooflineError(f"{where}: expert_activation must be silu, swiglu_oai or relu2, but "
                            f"{show_value(m.expert_activation)} was given.")
    for name in ("n_experts", "n_active", "moe_intermediate", "shared_intermediate", "q_lora_rank", "kv_lora_rank",
                 "qk_rope_dim", "qk_nope_dim", "v_head_dim", "rotary_dim", "mtp_layers"):
        v = int_field(where, name, getattr(m, name), 0)
        object.__setattr__(m, name, bounded(where, name, v, MAX_SIZES[name]) if name in MAX_SIZES else v)
    if m.rope_interleave and not m.kv_lora_rank and (m.rotary_dim or m.qk_norm):
        raise RooflineError(f"{where}: rope_interleave (the rotary pairs interleaved in q/k_proj) is modelled on "
                            "every head dimension without qk-norm: set rotary_dim 0 and qk_norm false, or "
                            "rope_interleave false.")
    if m.rotary_dim and (m.rotary_dim % 2 or m.rotary_dim > m.head_dim):
        raise RooflineError(f"{where}: rotary_dim must be even and at most head_dim ({m.head_dim}), but "
                            f"{m.rotary_dim} was given (0 means every head dimension).")
    for name in ("n_group", "topk_group"):
        object.__setattr__(m, name, int_field(where, name, getattr(m, name), 1))
    object.__setattr__(m, "routed_scale", float_field(where, "routed_scale", m.routed_scale))
    if m.n_experts:
        if not 1 <= m.n_active <= m.n_experts or not m.moe_intermediate:
            raise RooflineError(f"{where}: a mixture of experts needs 1 <= n_active ({m.n_active}) <= n_experts "
                                f"({m.n_experts}) and a moe_intermediate width ({m.moe_intermediate}).")
        if m.n_experts % m.n_group or m.topk_group > m.n_group:
            raise RooflineError(f"{where}: n_group ({m.n_group}) must divide n_experts ({m.n_experts}) and be at "
                                f"least topk_group ({m.topk_group}).")
    for name in ("dense_layers", "nope_layers"):
        idx = getattr(m, name)
        if not isinstance(idx, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                     or not 0 <= i < m.n_layers for i in idx):
            raise RooflineError(f"{where}: {name} must list layer indices 0..{m.n_layers - 1}, but "
                                f"{show_value(idx)} was given.")
        object.__setattr__(m, name, tuple(sorted(set(idx))))
    yarn = m.rope_yarn
    if not isinstance(yarn, (list, tuple)) or len(yarn) not in (0, 6):
        raise RooflineError(f"{where}: rope_yarn must be (factor, beta_fast, beta_slow, original positions, "
                            f"attention factor, truncate) or empty, but {show_value(yarn)} was given.")
    object.__setattr__(m, "rope_yarn", tuple(yarn))
    if m.kv_lora_rank and not (m.qk_rope_dim and m.qk_nope_dim and m.v_head_dim):
        raise RooflineError(f"{where}: latent attention (kv_lora_rank {m.kv_lora_rank}) needs qk_rope_dim, "
                            "qk_nope_dim and v_head_dim.")
    _check_index(m, where)


INDEX_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")


def _check_index(m: "ModelConfig", where: str) -> None:
    """DeepSeek Sparse Attention's sizes: all >= 1 over latent attention with a q latent (the indexer's query
    reads it), the rope dims within the indexer's head, layer 0 with an indexer of its own; else all 0."""
    for name in INDEX_FIELDS:
        object.__setattr__(m, name, int_field(where, name, getattr(m, name), 0))
    given = [getattr(m, n) for n in INDEX_FIELDS]
    shared = m.index_shared
    if not isinstance(shared, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                    or not 0 < i < m.n_layers for i in shared):
        raise RooflineError(f"{where}: index_shared must list layer indices 1..{m.n_layers - 1} (layer 0 runs its "
                            f"own indexer), but {show_value(shared)} was given.")
    object.__setattr__(m, "index_shared", tuple(sorted(set(shared))))
    if not any(given) and not shared:
        return
    if not all(given) or not (m.mla and m.q_lora_rank) or m.index_head_dim < m.qk_rope_dim:
        raise RooflineError(f"{where}: DeepSeek Sparse Attention needs {', '.join(INDEX_FIELDS)} >= 1 over latent "
                            "attention with q_lora_rank (the indexer's query reads the q latent) and index_head_dim "
                            f">= qk_rope_dim, but {dict(zip(INDEX_FIELDS, given))} was given with kv_lora_rank "
                            f"{m.kv_lora_rank}, q_lora_rank {m.q_lora_rank}: give them all or leave them 0.")


LINEAR_FIELDS = ("linear_k_heads", "linear_v_heads", "linear_k_dim", "linear_v_dim", "linear_conv")


def _check_linear(m: "ModelConfig", where: str) -> None:
    """Gated DeltaNet's sizes: all given (each >= 1, the k heads dividing the v heads) when layer_types has a
    "linear" layer, else all 0."""
    for name in LINEAR_FIELDS:
        object.__setattr__(m, name, int_field(where, name, getattr(m, name), 0))
    given = [getattr(m, n) for n in LINEAR_FIELDS]
    if m.linear_layers:
        if not all(given) or m.linear_v_heads % m.linear_k_heads:
            raise RooflineError(f"{where}: linear-attention layers need {', '.join(LINEAR_FIELDS)} >= 1 with "
                                f"linear_k_heads dividing linear_v_heads, but {dict(zip(LINEAR_FIELDS, given))} "
                                "was given.")
        if m.mla:
            raise RooflineError(f"{where}: linear-attention layers beside latent attention are not modelled: give "
                                "one or the other.")
    elif any(given):
        raise RooflineError(f"{where}: {', '.join(LINEAR_FIELDS)} size Gated DeltaNet layers, but layer_types names "
                            "no \"linear\" layer: give layer_types or leave them 0.")


MAMBA_FIELDS = ("mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups", "mamba_conv", "mamba_chunk")


def _check_mamba(m: "ModelConfig", where: str) -> None:
    """Mamba-2's sizes: all given (each >= 1, the groups dividing the heads) when layer_types has a "mamba" layer,
    else all 0; no_mlp_layers: indices of layers that have a mixer."""
    for name in MAMBA_FIELDS:
        object.__setattr__(m, name, int_field(where, name, getattr(m, name), 0))
    given = [getattr(m, n) for n in MAMBA_FIELDS]
    if m.mamba_layers:
        if not all(given) or m.mamba_heads % m.mamba_groups:
            raise RooflineError(f"{where}: Mamba-2 layers need {', '.join(MAMBA_FIELDS)} >= 1 with mamba_groups "
                                f"dividing mamba_heads, but {dict(zip(MAMBA_FIELDS, given))} was given.")
        if m.mla:
            raise RooflineError(f"{where}: Mamba-2 layers beside latent attention are not modelled: give one or the "
                                "other.")
    elif any(given):
        raise RooflineError(f"{where}: {', '.join(MAMBA_FIELDS)} size Mamba-2 layers, but layer_types names no "
                            "\"mamba\" layer: give layer_types or leave them 0.")
    for name in ("mamba_dt_min", "mamba_dt_max"):
        v = getattr(m, name)
        if v != 0:
            object.__setattr__(m, name, float_field(where, name, v, " (0 means no bound)"))
    if m.mamba_dt_max and m.mamba_dt_max < m.mamba_dt_min:
        raise RooflineError(f"{where}: mamba_dt_max ({m.mamba_dt_max}) is below mamba_dt_min ({m.mamba_dt_min}): "
                            "give min <= max (0: no bound).")
    nm = m.no_mlp_layers
    if (not isinstance(nm, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in nm)
            or any(not 0 <= i < m.n_layers or (m.layer_types and m.layer_types[i] == "mlp") for i in nm)):
        raise RooflineError(f"{where}: no_mlp_layers must list layer indices below n_layers whose layer_types is not "
                            f"\"mlp\" (a layer keeps a mixer or an MLP), but {show_value(nm)} was given.")
    object.__setattr__(m, "no_mlp_layers", tuple(sorted(set(nm))))


# Every family's presets (roofline.families: published config.json numbers, each with its source), then the
# toy ones, which no family publishes.
PRESETS: dict[str, ModelConfig] = {p.name: ModelConfig(p.name, *p.sizes, arch=mtype, **p.fields)
                                   for mtype, p in presets()}
PRESETS.update((m.name, m) for m in [
    # CPU- and test-sized mixtures: 8 experts top-2 (Mixtral's layout), and a DeepSeek-like latent-attention one.
    ModelConfig("tiny-moe", 64, 96, 2, 4, 2, 256, 512, arch="mixtral", n_experts=8, n_active=2, moe_intermediate=48),
    ModelConfig("tiny-mla", 64, 96, 2, 4, 4, 256, 512, head_dim=24, arch="deepseek_v3", n_experts=4, n_active=2,
                moe_intermediate=32, router="sigmoid_group", routed_scale=2.5, n_group=2, topk_group=1,
                router_correction=True, shared_intermediate=32, dense_layers=(0,), q_lora_rank=32, kv_lora_rank=32,
                qk_rope_dim=8, qk_nope_dim=16, v_head_dim=16, rope_interleave=True),
    # CPU-sized: ~40M parameters; its ops take milliseconds on two cores, so a sweep is quick.
    ModelConfig("small", 512, 1408, 4, 8, 2, 8192, 2048),
    # Test-sized: small enough for the Triton interpreter.
    ModelConfig("tiny", 64, 176, 2, 4, 2, 256, 512),
])


def load_model(name_or_path: str, allow_unknown_fields: bool = False) -> ModelConfig:
    """A preset by name, or a local Hugging Face config.json (a file or its folder); ``allow_unknown_fields``: a
    config key its family does not know is ignored (listed in the notes), not refused."""
    key = str(name_or_path).strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    p = Path(name_or_path)
    if p.is_dir():
        if p.name == "config.json" and not (p / "config.json").exists():
            raise RooflineError(f"model config {p} is a folder, not a file: give the path of a Hugging Face "
                                "config.json file (or of the folder that holds one).")
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        return ModelConfig(**read_hf_config(read_json_file(p, "model config"), p, allow_unknown_fields))
    spellings = {re.sub(r"[^a-z0-9]", "", k): k for k in PRESETS} | {k: k for k in PRESETS}
    hint = did_you_mean(re.sub(r"[^a-z0-9]", "", key), spellings) or did_you_mean(key, spellings)
    raise RooflineError(f"Unknown model {name_or_path!r}{hint}. Presets: {', '.join(PRESETS)}; "
                        "or give the path to a local Hugging Face config.json.")
