"""Llama-style model configs: presets with their reasons, and local HF config.json files.

Nothing is downloaded: ``load_model`` takes a preset name or a path to a config.json.

Every input is checked where it enters, in one place (``_checked``, used by
``ModelConfig.__post_init__`` -- hence by ``from_dict`` -- and by the config.json reader),
and a bad one is a one-line ``RooflineError`` naming the field, the value, the rule and
what to do. What the model does not implement (RoPE scaling) is kept as a sentence in
``ModelConfig.notes``, never silently dropped.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import MISSING, asdict, dataclass, field, replace
from pathlib import Path

from .errors import RooflineError

# ---- input helpers (shared with roofline.devices) ---------------------------------------------


class _Written(float):
    """A JSON number that does not fit a finite float (1e400): remembers how it was written."""

    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.text = text
        return obj


def _parse_float(text: str) -> float:
    v = float(text)
    return v if math.isfinite(v) else _Written(text)


def show_value(v, limit: int = 80) -> str:
    """A value as the user wrote it in JSON (true, null, "4096", Infinity), with its kind where that is the problem."""
    if isinstance(v, bool):
        return f"{'true' if v else 'false'} (a boolean)"
    if v is None:
        return "null"
    if isinstance(v, _Written):
        return f"{v.text} (too large for a number)"
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    try:
        s = json.dumps(v, allow_nan=True)
    except (TypeError, ValueError):
        s = repr(v)
    if len(s) > limit:
        s = s[: limit - 3] + "..."
    if isinstance(v, str):
        return f"{s} (a string)"
    if isinstance(v, (list, tuple)):
        return f"{s} (a list)"
    return s


def read_json_file(path, what: str):
    """The parsed JSON of a file, or a one-line RooflineError: missing, a folder, unreadable, not text, not JSON."""
    p = Path(path)
    where = f"{what} {p}"
    if p.is_dir():
        raise RooflineError(f"{where} is a folder, not a file: give the path of the JSON file itself.")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise RooflineError(f"{where} does not exist.") from None
    except PermissionError:
        raise RooflineError(f"{where} cannot be read (permission denied): check its permissions.") from None
    except OSError as e:
        raise RooflineError(f"{where} cannot be read ({e.strerror or e}): give a readable JSON file.") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RooflineError(f"{where} is not a UTF-8 text file (byte 0x{raw[e.start]:02x} at offset {e.start}): "
                            "give a JSON file.") from None
    try:
        return json.loads(text, parse_float=_parse_float)
    except json.JSONDecodeError as e:
        raise RooflineError(f"{where} is not valid JSON (line {e.lineno}): {e.msg}.") from None
    except RecursionError:
        raise RooflineError(f"{where} is nested too deeply to be a config: give a flat JSON object.") from None


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _int_field(where: str, name: str, value, minimum: int = 1, hint: str = "") -> int:
    """``value`` as an int >= ``minimum`` (an integral float such as 4096.0 counts), else RooflineError."""
    ok = False
    if _is_number(value):
        try:
            ok = float(value).is_integer() and int(value) >= minimum
        except OverflowError:  # an int too large for a float is still an int
            ok = isinstance(value, int) and value >= minimum
    if not ok:
        rule = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise RooflineError(f"{where}: {name} must be {rule}{hint}, but {show_value(value)} was given.")
    return int(value)


def _float_field(where: str, name: str, value, hint: str = "") -> float:
    """``value`` as a positive, finite float, else RooflineError."""
    try:
        ok = _is_number(value) and math.isfinite(float(value)) and float(value) > 0
    except OverflowError:
        ok = False
    if not ok:
        raise RooflineError(f"{where}: {name} must be a positive finite number{hint}, but {show_value(value)} "
                            "was given.")
    return float(value)


def _bool_field(where: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise RooflineError(f"{where}: {name} must be true or false (a JSON boolean, not a string or number), "
                            f"but {show_value(value)} was given.")
    return value


_INT_FIELDS = ("hidden", "intermediate", "n_layers", "n_heads", "n_kv_heads", "vocab", "max_context")
_CHECKED = _INT_FIELDS + ("head_dim", "rope_theta", "rms_eps", "tie_embeddings")

# Field names and hints as a user of the dataclass sees them, and as a config.json spells them.
_OWN_NAMES = {f: f for f in _CHECKED}
_OWN_HINTS = {"head_dim": " (0 means hidden / n_heads)"}
_HF_NAMES = {"hidden": "hidden_size", "intermediate": "intermediate_size", "n_layers": "num_hidden_layers",
             "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "vocab": "vocab_size",
             "max_context": "max_position_embeddings", "head_dim": "head_dim", "rope_theta": "rope_theta",
             "rms_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
_HF_HINTS = {"n_kv_heads": " (absent means num_attention_heads)",
             "head_dim": " (absent means hidden_size / num_attention_heads)"}


def _checked(v: dict, where: str, names: dict, hints: dict) -> dict:
    """The one validation of a model's sizes: ``v`` (our field names) -> normalised values, or RooflineError.

    ``names``/``hints`` say how the fields are spelled where they came from (the dataclass or a config.json).
    """
    out = {f: _int_field(where, names[f], v[f], 1, hints.get(f, "")) for f in _INT_FIELDS}
    hd = _int_field(where, names["head_dim"], v["head_dim"], 0, hints.get("head_dim", ""))
    h, nh, nkv = out["hidden"], out["n_heads"], out["n_kv_heads"]
    N = names.get
    derived = hd == 0
    if derived:
        if h % nh:
            raise RooflineError(f"{where}: {N('hidden')} ({h}) must be a multiple of {N('n_heads')} ({nh}) when no "
                                f"head_dim is given; give head_dim explicitly or fix the sizes.")
        hd = h // nh
    if hd % 2:
        how = f" ({N('hidden')} {h} / {N('n_heads')} {nh})" if derived else ""
        raise RooflineError(f"{where}: head_dim must be even (RoPE rotates pairs of dimensions), but it is {hd}{how}; "
                            "give an even head_dim.")
    if nh % nkv:
        raise RooflineError(f"{where}: {N('n_heads')} ({nh}) must be a multiple of {N('n_kv_heads')} ({nkv}) "
                            "(each key/value head serves a whole group of query heads); fix one of them.")
    out["head_dim"] = hd
    out["rope_theta"] = _float_field(where, N("rope_theta"), v["rope_theta"], " (the RoPE base, e.g. 10000)")
    out["rms_eps"] = _float_field(where, N("rms_eps"), v["rms_eps"], " (e.g. 1e-05)")
    out["tie_embeddings"] = _bool_field(where, N("tie_embeddings"), v["tie_embeddings"])
    return out


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
    # ---- architecture (roofline.architectures reads these from a config.json per model_type; the
    # defaults are a Llama). Each changes cost or numerics and is modelled by roofline.layer's ops.
    arch: str = "llama"            # the Hugging Face model_type the config was read as
    qkv_bias: bool = False         # biases on q/k/v_proj (Qwen2; Llama's attention_bias)
    o_bias: bool = False           # a bias on o_proj (Llama's attention_bias)
    mlp_bias: bool = False         # biases on gate/up/down_proj (Llama's mlp_bias)
    qk_norm: bool = False          # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma-3)
    activation: str = "silu"       # the gated MLP's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    norm_offset: bool = False      # RMSNorm multiplies by (1 + w) (Gemma): numerics only
    sandwich_norms: bool = False   # norms after attention and after the MLP too (Gemma-2/3: four per layer)
    embed_scale: bool = False      # embeddings multiplied by sqrt(hidden) (Gemma)
    query_scale: float = 0.0       # attention's score scale; 0: 1/sqrt(head_dim) (Gemma-2/3: query_pre_attn_scalar**-0.5)
    attn_softcap: float = 0.0      # scores -> c * tanh(scores / c) (Gemma-2); 0: none
    final_softcap: float = 0.0     # logits -> c * tanh(logits / c) (Gemma-2); 0: none
    sliding_window: int = 0        # keys a windowed layer's query sees (itself included); 0: no window
    layer_types: tuple = ()        # per layer "full" or "sliding"; () with a window: every layer slides
    rope_local_theta: float = 0.0  # RoPE base of the sliding layers (Gemma-3); 0: rope_theta
    rope_yarn: tuple = ()          # YaRN: (factor, beta_fast, beta_slow, original max positions, attention factor,
                                   # truncate) as kernels.rope.rope_tables takes it (GPT-OSS, DeepSeek-V3)
    attn_sinks: bool = False       # a learned logit per query head in every softmax's denominator (GPT-OSS)
    # ---- mixture of experts (roofline.layer: router, experts, shared_* ops; 0 experts: a dense model)
    n_experts: int = 0             # routed experts per MoE layer
    n_active: int = 0              # experts each token is routed to (top-k)
    moe_intermediate: int = 0      # one routed expert's intermediate width
    router: str = "softmax_topk"   # softmax_topk (Mixtral, Qwen), topk_softmax (GPT-OSS), sigmoid_group (DeepSeek)
    norm_topk: bool = True         # renormalise the k routing weights to sum to 1
    routed_scale: float = 1.0      # routing weights x this (DeepSeek's routed_scaling_factor)
    n_group: int = 1               # DeepSeek: expert groups, of which topk_group are kept per token
    topk_group: int = 1
    router_bias: bool = False      # a bias on the router GEMM (GPT-OSS)
    router_correction: bool = False  # DeepSeek's e_score_correction_bias (added to choose, not to weigh)
    expert_bias: bool = False      # biases on every expert's projections (GPT-OSS)
    expert_activation: str = "silu"  # silu (SwiGLU) or swiglu_oai (GPT-OSS: clamped, alpha 1.702, up + 1)
    shared_intermediate: int = 0   # width of the shared expert(s) every token runs (Qwen2-MoE, DeepSeek)
    shared_gate: bool = False      # the shared expert's output x sigmoid(a [H, 1] gate) (Qwen2-MoE)
    dense_layers: tuple = ()       # layers of an MoE model that keep a dense MLP (DeepSeek's first 3)
    # ---- multi-head latent attention (DeepSeek): kv_lora_rank > 0
    q_lora_rank: int = 0           # 0: q = x W_q directly
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    qk_nope_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False  # the rope dims are stored interleaved (DeepSeek): loaded de-interleaved
    # The folder of the checkpoint's *.safetensors when the config came with weights ("": random weights).
    checkpoint: str = field(default="", compare=False)
    # Sentences about what the config holds and the model does not implement (e.g. RoPE scaling).
    notes: tuple = field(default=(), compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise RooflineError(f"model description: name must be a string, but {show_value(self.name)} was given.")
        where = f"model {self.name!r}"
        values = _checked({f: getattr(self, f) for f in _CHECKED}, where, _OWN_NAMES, _OWN_HINTS)
        for k, v in values.items():
            object.__setattr__(self, k, v)
        notes = self.notes
        if not isinstance(notes, (list, tuple)) or not all(isinstance(n, str) for n in notes):
            raise RooflineError(f"{where}: notes must be a list of sentences (strings), but {show_value(notes)} "
                                "was given.")
        object.__setattr__(self, "notes", tuple(notes))
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
    def moe_layers(self) -> tuple:
        """The layer indices whose MLP is a mixture of experts (none for a dense model)."""
        if not self.n_experts:
            return ()
        return tuple(i for i in range(self.n_layers) if i not in self.dense_layers)

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

    def params(self) -> int:
        """Parameter count: every weight the model's ops read (roofline.layer), the embedding and lm_head
        counted separately unless tied."""
        from .layer import model_params

        return model_params(self)

    def with_layers(self, n_layers: int) -> "ModelConfig":
        types = self.layer_types
        if types:   # keep the pattern: the first n_layers layers' types
            types = tuple(types[i % len(types)] for i in range(n_layers))
        dense = tuple(i for i in self.dense_layers if i < n_layers)
        return replace(self, n_layers=n_layers, layer_types=types, dense_layers=dense,
                       name=f"{self.name} ({n_layers} layers)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["layer_types"] = list(self.layer_types)
        d["dense_layers"] = list(self.dense_layers)
        d["rope_yarn"] = list(self.rope_yarn)
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
        for k in ("layer_types", "dense_layers", "rope_yarn"):
            if isinstance(kw.get(k), list):
                kw[k] = tuple(kw[k])
        return cls(**kw)


ACTIVATIONS = ("silu", "gelu_tanh")
ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_group")


def _check_arch(m: "ModelConfig", where: str) -> None:
    """The architecture fields' rules (one line each, like the sizes')."""
    if m.activation not in ACTIVATIONS:
        raise RooflineError(f"{where}: activation must be one of {', '.join(ACTIVATIONS)}, but "
                            f"{show_value(m.activation)} was given.")
    for name in ("qkv_bias", "o_bias", "mlp_bias", "qk_norm", "norm_offset", "sandwich_norms", "embed_scale",
                 "attn_sinks", "norm_topk", "router_bias", "router_correction", "expert_bias", "shared_gate",
                 "rope_interleave"):
        _bool_field(where, name, getattr(m, name))
    for name in ("query_scale", "attn_softcap", "final_softcap", "rope_local_theta"):
        v = getattr(m, name)
        if v != 0:
            object.__setattr__(m, name, _float_field(where, name, v, " (0 means none)"))
    object.__setattr__(m, "sliding_window", _int_field(where, "sliding_window", m.sliding_window, 0,
                                                       " (0 means no window)"))
    types = m.layer_types
    if not isinstance(types, (list, tuple)) or any(t not in ("full", "sliding") for t in types):
        raise RooflineError(f"{where}: layer_types must be a list of \"full\" or \"sliding\" per layer, but "
                            f"{show_value(types)} was given.")
    if types and len(types) != m.n_layers:
        raise RooflineError(f"{where}: layer_types has {len(types)} entries for {m.n_layers} layers: give one per "
                            "layer.")
    if "sliding" in types and not m.sliding_window:
        raise RooflineError(f"{where}: layer_types has sliding layers but sliding_window is 0: give the window.")
    object.__setattr__(m, "layer_types", tuple(types))
    if m.router not in ROUTERS:
        raise RooflineError(f"{where}: router must be one of {', '.join(ROUTERS)}, but {show_value(m.router)} was given.")
    if m.expert_activation not in ("silu", "swiglu_oai"):
        raise RooflineError(f"{where}: expert_activation must be silu or swiglu_oai, but "
                            f"{show_value(m.expert_activation)} was given.")
    for name in ("n_experts", "n_active", "moe_intermediate", "shared_intermediate", "q_lora_rank", "kv_lora_rank",
                 "qk_rope_dim", "qk_nope_dim", "v_head_dim"):
        object.__setattr__(m, name, _int_field(where, name, getattr(m, name), 0))
    for name in ("n_group", "topk_group"):
        object.__setattr__(m, name, _int_field(where, name, getattr(m, name), 1))
    object.__setattr__(m, "routed_scale", _float_field(where, "routed_scale", m.routed_scale))
    if m.n_experts:
        if not 1 <= m.n_active <= m.n_experts or not m.moe_intermediate:
            raise RooflineError(f"{where}: a mixture of experts needs 1 <= n_active ({m.n_active}) <= n_experts "
                                f"({m.n_experts}) and a moe_intermediate width ({m.moe_intermediate}).")
        if m.n_experts % m.n_group or m.topk_group > m.n_group:
            raise RooflineError(f"{where}: n_group ({m.n_group}) must divide n_experts ({m.n_experts}) and be at "
                                f"least topk_group ({m.topk_group}).")
    dense = m.dense_layers
    if not isinstance(dense, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                   or not 0 <= i < m.n_layers for i in dense):
        raise RooflineError(f"{where}: dense_layers must list layer indices 0..{m.n_layers - 1}, but "
                            f"{show_value(dense)} was given.")
    object.__setattr__(m, "dense_layers", tuple(sorted(set(dense))))
    yarn = m.rope_yarn
    if not isinstance(yarn, (list, tuple)) or len(yarn) not in (0, 6):
        raise RooflineError(f"{where}: rope_yarn must be (factor, beta_fast, beta_slow, original positions, "
                            f"attention factor, truncate) or empty, but {show_value(yarn)} was given.")
    object.__setattr__(m, "rope_yarn", tuple(yarn))
    if m.kv_lora_rank and not (m.qk_rope_dim and m.qk_nope_dim and m.v_head_dim):
        raise RooflineError(f"{where}: latent attention (kv_lora_rank {m.kv_lora_rank}) needs qk_rope_dim, "
                            "qk_nope_dim and v_head_dim.")


# GPT-OSS's YaRN: x32 over 4,096 positions, beta 32 / 1, attention factor 0.1 ln 32 + 1, not truncated.
_GPT_OSS_YARN = (32.0, 32.0, 1.0, 4096, 0.1 * math.log(32.0) + 1.0, False)


def _alternate(n: int, every: int) -> tuple:
    """Layer types where every ``every``-th layer (1-based) is full and the rest slide (Gemma-2: 2, Gemma-3: 6)."""
    return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n))


# Presets from each model's published config.json (Hugging Face hub), reasons beside.
PRESETS: dict[str, ModelConfig] = {m.name: m for m in [
    ModelConfig("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 4096),            # MHA
    ModelConfig("llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 4096),           # MHA
    ModelConfig("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096),            # GQA 8:1
    ModelConfig("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, rope_theta=500000.0),   # GQA 4:1, big vocab
    ModelConfig("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, rope_theta=500000.0),
    # mistralai/Mistral-7B-v0.1: every layer attends over a 4,096-token window.
    ModelConfig("mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, arch="mistral", sliding_window=4096),
    # Qwen/Qwen2.5-7B-Instruct: q/k/v biases; use_sliding_window false.
    ModelConfig("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 32768, rope_theta=1e6, rms_eps=1e-6, arch="qwen2",
                qkv_bias=True),
    # Qwen/Qwen3-8B: qk-norm, head_dim 128 (not hidden/heads), no biases.
    ModelConfig("qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 40960, head_dim=128, rope_theta=1e6, rms_eps=1e-6,
                arch="qwen3", qk_norm=True),
    # google/gemma-2-9b: GeGLU, (1+w) norms, four per layer, sqrt(hidden) embedding scale, softcaps 50/30,
    # every other layer (the first) over a 4,096 window, head_dim 256, query_pre_attn_scalar 256, tied.
    ModelConfig("gemma-2-9b", 3584, 14336, 42, 16, 8, 256000, 8192, head_dim=256, rms_eps=1e-6,
                tie_embeddings=True, arch="gemma2", activation="gelu_tanh", norm_offset=True, sandwich_norms=True,
                embed_scale=True, query_scale=256 ** -0.5, attn_softcap=50.0, final_softcap=30.0,
                sliding_window=4096, layer_types=_alternate(42, 2)),
    # google/gemma-3-12b-pt (text): as Gemma-2 without softcaps, plus qk-norm; 5 of every 6 layers over a
    # 1,024 window with RoPE base 10,000, the 6th global with base 1e6 (its linear RoPE scaling x8 is a note).
    ModelConfig("gemma-3-12b", 3840, 15360, 48, 16, 8, 262208, 131072, head_dim=256, rope_theta=1e6,
                rms_eps=1e-6, tie_embeddings=True, arch="gemma3_text", qk_norm=True, activation="gelu_tanh",
                norm_offset=True, sandwich_norms=True, embed_scale=True, query_scale=256 ** -0.5,
                sliding_window=1024, layer_types=_alternate(48, 6), rope_local_theta=10000.0,
                notes=('rope_scaling {"rope_type": "linear", "factor": 8.0} (global layers) is not modelled: RoPE '
                       "uses plain theta=1e+06; costs are unaffected, logits differ from the real model.",)),
    # microsoft/Phi-3-mini-4k-instruct: fused qkv_proj / gate_up_proj (costed as the split ones), MHA,
    # a 2,047-token window on every layer.
    ModelConfig("phi-3-mini", 3072, 8192, 32, 32, 32, 32064, 4096, arch="phi3", sliding_window=2047),
    # ---- mixtures of experts (issue 21); every layer's MLP is routed unless dense_layers says otherwise
    # mistralai/Mixtral-8x7B-v0.1: 8 experts of 14,336, top-2, softmax then renormalised (46.7B, 12.9B active).
    ModelConfig("mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, 32768, rope_theta=1e6, arch="mixtral", n_experts=8,
                n_active=2, moe_intermediate=14336),
    # Qwen/Qwen3-30B-A3B: 128 experts of 768, top-8, renormalised; qk-norm, head_dim 128 (30.5B, 3.3B active).
    ModelConfig("qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 151936, 40960, head_dim=128, rope_theta=1e6, rms_eps=1e-6,
                arch="qwen3_moe", qk_norm=True, n_experts=128, n_active=8, moe_intermediate=768),
    # deepseek-ai/DeepSeek-V3: MLA (q rank 1,536, kv rank 512, rope 64, nope 128, v 128); 256 routed experts of
    # 2,048, top-8 by sigmoid scores in 4 of 8 groups, x2.5, one shared expert; the first 3 layers dense (18,432).
    # YaRN RoPE (x40; the softmax scale carries its mscale^2). Cost model only here: it fits no single GPU (671B).
    ModelConfig("deepseek-v3", 7168, 18432, 61, 128, 128, 129280, 163840, head_dim=192, rms_eps=1e-6,
                arch="deepseek_v3", n_experts=256, n_active=8, moe_intermediate=2048, router="sigmoid_group",
                norm_topk=True, routed_scale=2.5, n_group=8, topk_group=4, router_correction=True,
                shared_intermediate=2048, dense_layers=(0, 1, 2), q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64,
                qk_nope_dim=128, v_head_dim=128, rope_interleave=True,
                query_scale=192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2, rope_yarn=(40.0, 32.0, 1.0, 4096, 1.0, True)),
    # openai/gpt-oss-20b / -120b: 32 / 128 experts of 2,880, top-4 (softmax over the chosen), biases everywhere,
    # attention sinks, clamped SwiGLU, every other layer (the first) over a 128-token window, YaRN RoPE (x32).
    # Their MXFP4 expert weights are a --weight-dtype choice.
    ModelConfig("gpt-oss-20b", 2880, 2880, 24, 64, 8, 201088, 131072, head_dim=64, rope_theta=150000.0,
                arch="gpt_oss", qkv_bias=True, o_bias=True, attn_sinks=True, sliding_window=128,
                layer_types=tuple("sliding" if i % 2 == 0 else "full" for i in range(24)), n_experts=32, n_active=4,
                moe_intermediate=2880, router="topk_softmax", router_bias=True, expert_bias=True,
                expert_activation="swiglu_oai", rope_yarn=_GPT_OSS_YARN),
    ModelConfig("gpt-oss-120b", 2880, 2880, 36, 64, 8, 201088, 131072, head_dim=64, rope_theta=150000.0,
                arch="gpt_oss", qkv_bias=True, o_bias=True, attn_sinks=True, sliding_window=128,
                layer_types=tuple("sliding" if i % 2 == 0 else "full" for i in range(36)), n_experts=128,
                n_active=4, moe_intermediate=2880, router="topk_softmax", router_bias=True, expert_bias=True,
                expert_activation="swiglu_oai", rope_yarn=_GPT_OSS_YARN),
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
]}

def load_model(name_or_path: str) -> ModelConfig:
    """A preset by name, or a local Hugging Face config.json (a file or its folder)."""
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
        from .architectures import read_hf_config

        return read_hf_config(read_json_file(p, "model config"), p)
    raise RooflineError(f"Unknown model {name_or_path!r}. Presets: {', '.join(PRESETS)}; "
                        "or give the path to a local Hugging Face config.json.")


def _brief(v, limit: int = 240) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= limit else s[: limit - 4] + " ...}"


def _rope(d: dict, where: str, notes: list) -> float:
    """rope_theta from the top level or from ``rope_parameters`` (current transformers); scaling becomes a note."""
    params = d.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise RooflineError(f"{where}: rope_parameters must be an object such as "
                            f'{{"rope_theta": 500000.0, "rope_type": "default"}}, but {show_value(params)} was given.')
    scaling = d.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise RooflineError(f"{where}: rope_scaling must be an object such as "
                            f'{{"rope_type": "llama3", "factor": 8.0}} or null, but {show_value(scaling)} was given.')
    top = d.get("rope_theta")
    nested = (params or {}).get("rope_theta")
    theta = 10000.0
    if top is not None:
        theta = _float_field(where, "rope_theta", top, " (the RoPE base, e.g. 10000)")
    if nested is not None:
        inner = _float_field(where, "rope_parameters.rope_theta", nested, " (the RoPE base, e.g. 10000)")
        if top is None:
            theta = inner
        elif inner != theta:
            notes.append(f"rope_theta {theta:g} and rope_parameters.rope_theta {inner:g} disagree: "
                         f"the top-level {theta:g} is used.")
    unmodelled = []
    for key, spec in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not spec:
            continue
        kind = spec.get("rope_type", spec.get("type"))
        if kind == "default" or (kind is None and set(spec) <= {"rope_theta"}):
            continue
        rest = {k: v for k, v in spec.items() if k != "rope_theta"}
        if any(rest == {k: v for k, v in s.items() if k != "rope_theta"} for _, s in unmodelled):
            continue  # the same scaling written under both keys: one note
        unmodelled.append((key, spec))
    for key, spec in unmodelled:
        notes.append(f"{key} {_brief(spec)} is not modelled: RoPE uses plain theta={theta:g}; "
                     "costs are unaffected, logits differ from the real model.")
    return theta
