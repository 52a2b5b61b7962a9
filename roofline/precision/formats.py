"""Number formats: one entry per way a tensor is stored, with its scales, counted to the byte.

A ``Format`` says how a weight (or an activation, or a KV cache) is held in memory: the element's bits, how its
scales are laid out (``Scales``: per tensor, per output channel, per 128 x 128 block, per group or micro-block
of input features, with a second-level tensor scale for NVFP4, zero points and GPTQ's row index), the roles it
can play (weight, act, kv), the arithmetic a GEMM on it runs at (``compute``: the activation dtype after
dequantizing in registers, or the fp8 / fp4 / int8 tensor-core rate when the activations are in the same
format), and the first NVIDIA capability whose kernels run it natively.

``weight_bytes(fmt, K, N, act_dtype)`` is the bytes of a K x N weight as stored, scales included; it is the one
place those bytes are counted. ``FORMATS`` is the registry: ``register`` adds an entry, ``weight_format`` /
``kv_format`` / ``act_format`` look one up by name (``"fp8"``, ``"fp8-block"``, ``"mxfp4"``, ``"int4"`` with
its group size, ...) and refuse an unknown one in one line naming the registered ones. This module imports
nothing of the package but its errors: every consumer (costs, capacity, the CLI's choices, kernels, reports,
devices) reads it, and nothing else lists dtype names.

Sources for the layouts:
- fp8 e4m3 / e5m2: the OCP 8-bit floating point spec (2023); per-tensor and per-channel scales as
  compressed-tensors writes them (``weight_scale`` fp32); 128 x 128 weight blocks with fp32 ``weight_scale_inv``
  and 1 x 128 dynamic activation groups as DeepSeek-V3 ships them (``quant_method: fp8``,
  ``weight_block_size``).
- MX (mxfp8, mxfp4): the OCP Microscaling Formats spec v1.0: blocks of 32 elements sharing one e8m0 scale;
  gpt-oss stores ``*_blocks`` (two e2m1 per byte) and ``*_scales`` (one uint8 per 32).
- NVFP4: blocks of 16 e2m1 elements with an e4m3 scale, and one fp32 scale per tensor (``weight_scale_2``), as
  ModelOpt writes it (``weight``, ``weight_scale``, ``weight_scale_2``, ``input_scale``).
- int4 GPTQ: ``qweight`` (8 values per int32), ``qzeros`` (int4 packed), fp16 ``scales`` per group,
  ``g_idx`` (an int32 per input row); AWQ the same without ``g_idx``.
- int8 / int4 ("ours"): the toolkit's own kernels' layouts (``kernels/quant.py``): per-output-channel scales,
  or groups of input rows, in the activation dtype, zero points optional.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import RooflineError

# Bytes of one element of the float types a scale or a plain tensor can be held in.
FLOAT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "e4m3": 1, "e5m2": 1, "e8m0": 1, "int32": 4}
PLAIN = ("fp32", "bf16", "fp16")   # activation dtypes: what a dequantized weight's GEMM computes in
INT4_GROUPS = (32, 64, 128)        # the int4 group sizes our kernels run (kernels/linear_int4.py)
INT4_GROUP = 128                   # the default int4 group


@dataclass(frozen=True)
class Scales:
    """How a weight's scales are laid out, for a K x N (in x out) weight.

    ``k``: input features one scale covers (0: all of them); ``n``: output features one scale covers (0: all of
    them). Per tensor: k = n = 0; per output channel: k = 0, n = 1; 128 x 128 blocks: k = n = 128; groups of g
    input rows (int4, MX, NVFP4): k = g, n = 1. ``dtype``: the scale's type ("act" = the activation dtype).
    ``zero``: a zero point's type beside each scale ("" symmetric; "act"; "int4" packed two per byte).
    ``tensor``: a second-level per-tensor scale's type (NVFP4: fp32). ``row_index``: an int32 per input row
    (GPTQ's ``g_idx``)."""

    k: int = 0
    n: int = 0
    dtype: str = ""
    zero: str = ""
    tensor: str = ""
    row_index: bool = False

    @property
    def none(self) -> bool:
        return not self.dtype

    def count(self, K: int, N: int) -> int:
        """Scales a K x N weight carries."""
        if self.none:
            return 0
        return (-(-K // self.k) if self.k else 1) * (-(-N // self.n) if self.n else 1)


@dataclass(frozen=True)
class Format:
    """One storage format (module docstring). ``bits``: one element's bits (e2m1 and int4 pack two per byte).
    ``compute``: the GEMM's arithmetic when the activations are in a matching format ("act": dequantized to the
    activation dtype, then its rate). ``native``: the NVIDIA capability from which tensor cores take it as is
    (fp8: 8.9, fp4: 10.0); ``None`` for the plain floats."""

    name: str
    element: str            # fp32, bf16, fp16, e4m3, e5m2, e2m1, int8, int4
    bits: int
    scales: Scales = Scales()
    roles: tuple = ("weight",)
    compute: str = "act"    # "act" | "fp8" | "fp4" | "int8"
    native: tuple | None = None
    label: str = ""         # how a report says it, e.g. "fp8 (128x128 blocks)"
    group_size: int = 0     # int4 / MX / NVFP4: input rows per scale (= scales.k); 0 when not grouped
    zero_point: bool = False
    kernel: str = ""        # the module of ours that runs it ("kernels.linear_fp8"); "": costed, not run by us

    @property
    def quantized(self) -> bool:
        return not self.scales.none

    def describe(self) -> str:
        return self.label or self.name


def _scale_bytes(dtype: str, act_dtype: str) -> int:
    return FLOAT_BYTES["int32" if dtype == "int32" else (act_dtype if dtype == "act" else dtype)]


def weight_bytes(fmt: Format, K: int, N: int, act_dtype: str = "bf16") -> float:
    """Bytes of a K x N weight stored in ``fmt``: the elements, their scales, zero points, a tensor scale and a
    row index (module docstring). int4 with g = 128 in bf16: K*N/2 + (K/128)*N*2."""
    s = fmt.scales
    total = K * N * fmt.bits / 8
    n_scales = s.count(K, N)
    if n_scales:
        total += n_scales * _scale_bytes(s.dtype, act_dtype)
        if s.zero == "int4":
            total += n_scales / 2
        elif s.zero:
            total += n_scales * _scale_bytes(s.zero, act_dtype)
        if s.tensor:
            total += _scale_bytes(s.tensor, act_dtype)
        if s.row_index:
            total += K * FLOAT_BYTES["int32"]
    return total


FORMATS: dict[tuple, Format] = {}   # (role, name) -> the format: one name may mean different formats per role
ALIASES: dict[tuple, str] = {}      # (role, another name a user may write) -> the format's name


def register(fmt: Format, *aliases: str) -> Format:
    """Add a format under its name, and the other names a user may write for it, in each of its roles ("fp8" is
    a per-channel e4m3 weight, per-token e4m3 activations, or our per-token e4m3 KV cache); a name registered
    twice for one role is refused."""
    for role in fmt.roles:
        for a in (fmt.name, *aliases):
            if (role, a) in FORMATS or (role, a) in ALIASES:
                raise RooflineError(f"{a!r} already names a {role} format.")
    for role in fmt.roles:
        FORMATS[(role, fmt.name)] = fmt
        ALIASES.update({(role, a): fmt.name for a in aliases})
    return fmt


def names(role: str) -> tuple:
    """The registered formats that can play ``role`` ("weight", "act", "kv"), in registration order."""
    return tuple(n for r, n in FORMATS if r == role)


def run_names(role: str) -> tuple:
    """The registered formats of ``role`` that a kernel of ours runs (``Format.kernel``): what ``profile``,
    ``latency`` and ``serve`` take, beside the activation dtype."""
    return tuple(n for n in names(role) if FORMATS[(role, n)].kernel)


def lookup(name, role: str) -> Format:
    """The format ``name`` as a ``role``; an unknown name, or one that cannot play the role, in one line."""
    key = str(name).strip().lower().removeprefix("torch.").replace("_", "-")
    f = FORMATS.get((role, ALIASES.get((role, key), key)))
    if f is None:
        what = {"weight": "weight", "act": "activation", "kv": "KV-cache"}[role]
        raise RooflineError(f"unknown {what} format {name!r}: choose one of {', '.join(names(role))}.")
    return f


def weight_format(name, group_size: int | None = None, zero_point: bool = False) -> Format:
    """A weight format by name; int4 takes its group size (``INT4_GROUPS``) and zero points."""
    f = lookup(name, "weight")
    if f.name != "int4":
        return f
    g = INT4_GROUP if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g not in INT4_GROUPS:
        raise RooflineError(f"the int4 group size must be one of {', '.join(map(str, INT4_GROUPS))}, "
                            f"but {group_size!r} was given.")
    zp = bool(zero_point)
    return replace(f, scales=replace(f.scales, k=g, zero="act" if zp else ""), group_size=g, zero_point=zp,
                   label=f"int4 (g{g}{', zero points' if zp else ''})")


def kv_format(name) -> Format:
    return lookup(name, "kv")


def act_format(name) -> Format:
    return lookup(name, "act")


def native_computes() -> dict:
    """{tensor-core rate: the first NVIDIA capability that has it} over the registered formats whose GEMM runs
    at a low-precision rate of its own (``Format.compute`` other than "act"): {"fp8": (8, 9), "fp4": (10, 0)}.
    The device catalogue's compute dtypes and the ceilings a GPU measures come from here."""
    out: dict = {}
    for f in FORMATS.values():
        if f.compute != "act" and f.native is not None:
            out[f.compute] = min(out.get(f.compute, f.native), f.native)
    return out


def paired_act(weight: Format):
    """The activation format a W8A8 / W4A4 GEMM of ``weight`` quantizes its input to: one of the same rate whose
    scales cover the same input features (fp8 per channel: per token; 128 x 128 blocks: 1 x 128 groups; NVFP4 and
    MX: blocks of their size); None for a weight-only format (int8, int4: dequantized into the activation dtype)."""
    if weight.compute == "act":
        return None
    return next((f for (r, _), f in FORMATS.items() if r == "act" and f.compute == weight.compute
                 and f.element == weight.element and f.scales.k == weight.scales.k), None)


def gemm_compute(weight: Format, act: Format, has_peak) -> str:
    """The rate a GEMM of ``weight`` x ``act`` runs at: the shared low-precision rate when both are in it and the
    device has that peak (``has_peak(dtype)``: W8A8 fp8, W4A4 fp4, W8A8 int8), else the activation's plain
    dtype (the weight dequantized in registers: W8A16, W4A16; and W4A4 where the device has no fp4)."""
    plain = act.element if act.element in PLAIN else "bf16"
    if weight.compute != "act" and weight.compute == act.compute and has_peak(weight.compute):
        return weight.compute
    return plain


# ---------------------------------------------------------------------------------------------------------------
# The formats. Plain floats first (weights, activations and KV caches alike).
for _n in PLAIN:
    register(Format(_n, _n, FLOAT_BYTES[_n] * 8, roles=("weight", "act", "kv")),
             *{"fp32": ("float32", "float", "f32"), "bf16": ("bfloat16",), "fp16": ("float16", "half", "f16")}[_n])

# fp8 e4m3 weights: per output channel (the default "fp8"), per tensor, 128 x 128 blocks (DeepSeek), MX blocks.
register(Format("fp8", "e4m3", 8, Scales(0, 1, "fp32"), ("weight",), "fp8", (8, 9), "fp8 e4m3 (per channel)", kernel="kernels.linear_fp8"),
         "fp8-channel", "fp8-e4m3", "e4m3", "float8-e4m3fn", "float8")
register(Format("fp8-tensor", "e4m3", 8, Scales(0, 0, "fp32"), ("weight",), "fp8", (8, 9),
                "fp8 e4m3 (per tensor)", kernel="kernels.linear_fp8"))
register(Format("fp8-block", "e4m3", 8, Scales(128, 128, "fp32"), ("weight",), "fp8", (8, 9),
                "fp8 e4m3 (128x128 blocks)", kernel="kernels.linear_fp8"))
register(Format("mxfp8", "e4m3", 8, Scales(32, 1, "e8m0"), ("weight", "act"), "fp8", (10, 0),
                "mxfp8 (blocks of 32, e8m0 scales)", group_size=32))
# fp4 e2m1: MX (32, e8m0: gpt-oss's experts) and NVFP4 (16, e4m3, and one fp32 per tensor).
register(Format("mxfp4", "e2m1", 4, Scales(32, 1, "e8m0"), ("weight", "act"), "fp4", (10, 0),
                "mxfp4 (blocks of 32, e8m0 scales)", group_size=32, kernel="kernels.linear_fp4"))
register(Format("nvfp4", "e2m1", 4, Scales(16, 1, "e4m3", tensor="fp32"), ("weight", "act"), "fp4", (10, 0),
                "nvfp4 (blocks of 16, e4m3 scales, fp32 tensor scale)", group_size=16, kernel="kernels.linear_fp4"), "fp4")
# Integers: our kernels' int8 (per channel) and int4 (groups, zero points optional), in the activation dtype; and
# the int4 layouts checkpoints ship (GPTQ with g_idx, AWQ), with fp16 scales and packed int4 zero points.
register(Format("int8", "int8", 8, Scales(0, 1, "act"), ("weight",), "act", None, "int8 (per channel)",
                kernel="kernels.linear_int8"), "i8")
register(Format("int4", "int4", 4, Scales(INT4_GROUP, 1, "act"), ("weight",), "act", None,
                f"int4 (g{INT4_GROUP})", group_size=INT4_GROUP, kernel="kernels.linear_int4"), "i4")
register(Format("gptq-int4", "int4", 4, Scales(INT4_GROUP, 1, "fp16", zero="int4", row_index=True), ("weight",),
                "act", None, "int4 GPTQ (g128)", group_size=INT4_GROUP, zero_point=True))
register(Format("awq-int4", "int4", 4, Scales(INT4_GROUP, 1, "fp16", zero="int4"), ("weight",), "act", None,
                "int4 AWQ (g128)", group_size=INT4_GROUP, zero_point=True))

# Activations in fp8: per-token dynamic scales (W8A8 per channel / per tensor) or 1 x 128 groups (DeepSeek).
register(Format("fp8", "e4m3", 8, Scales(0, 1, "fp32"), ("act",), "fp8", (8, 9),
                "fp8 e4m3 (per-token dynamic scales)"), "fp8-token", "fp8-e4m3", "e4m3", "float8")
register(Format("fp8-group", "e4m3", 8, Scales(128, 1, "fp32"), ("act",), "fp8", (8, 9),
                "fp8 e4m3 (1x128 dynamic groups)", group_size=128))
# ... or one static fp32 scale per tensor, calibrated and stored beside the weight (``input_scale``: compressed-
# tensors' static per-tensor scheme, ModelOpt's FP8).
register(Format("fp8-tensor", "e4m3", 8, Scales(0, 0, "fp32"), ("act",), "fp8", (8, 9),
                "fp8 e4m3 (static per-tensor scale)"))

# KV caches. Our kernels' 8-bit caches (fp8 e4m3, int8) keep an fp32 scale per token and KV head
# (roofline.formulas.kv_scale_bytes); a checkpoint's fp8 cache (vLLM's k_scale / v_scale) one per layer's tensor.
register(Format("fp8", "e4m3", 8, Scales(0, 1, "fp32"), ("kv",), "fp8", (8, 9),
                "fp8 e4m3 (per-token, per-head scales)", kernel="kernels.kv_append"), "fp8-e4m3", "e4m3", "float8-e4m3fn",
         "float8")
register(Format("int8", "int8", 8, Scales(0, 1, "fp32"), ("kv",), "act", None,
                "int8 (per-token, per-head scales)", kernel="kernels.kv_append"), "i8")
register(Format("fp8-tensor", "e4m3", 8, Scales(0, 0, "fp32"), ("kv",), "fp8", (8, 9),
                "fp8 e4m3 (per-tensor scales, as vLLM)"))
register(Format("fp8-e5m2", "e5m2", 8, Scales(0, 0, "fp32"), ("kv",), "fp8", (8, 9),
                "fp8 e5m2 (per-tensor scales, as vLLM)"), "e5m2", "float8-e5m2")
