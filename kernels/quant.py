"""Weight-only quantized weights and 8-bit KV caches: the containers and the rules every kernel shares.

    from kernels.quant import quantize_weight
    qw = quantize_weight(w, "int8")                  # w: [K, N] float -> QuantWeight (per-output-channel scales)
    qw = quantize_weight(w, "int4", group_size=64)   # two values per byte, a scale per 64 input rows
    y = get_ops("triton").linear(x, qw)              # the backends' linear takes either kind of weight

``QuantWeight`` holds a [K, N] weight the way its kernel reads it (``kernels.linear_int8``:
int8 [N, K] + scales [N]; ``kernels.linear_int4``: packed uint8 [N, K/2] + scales [K/g, N] and
optional zero points), and, once ``prepare_torch`` ran, what the torch backend runs: the
ecosystem's own CPU/GPU op (``torch.ops.aten._weight_int8pack_mm``, ``_weight_int4pack_mm*``)
where this torch has it for this shape and dtype, else a dequantize reference (x @ the
dequantized weight), said in ``torch_impl``, which the sweep records in its ``config``.

``QuantExperts`` holds a mixture of experts' [E, K, N] weights quantized the same way, expert by
expert (``quantize_experts``: E ``QuantWeight``s stacked): int8 [E, N, K] + scales [E, N], or int4
[E, N, K/2] + scales (zeros) [E, K/g, N]. ``kernels.moe``'s fused kernels read the stack; the torch
backend runs each expert's ``QuantWeight`` view (``expert(e)``) through ``torch_linear``.

An 8-bit KV cache (``KV_DTYPES``) stores K and V as int8 or fp8 e4m3 with one fp32 scale per
token per KV head (``kernels.kv_append`` quantizes; the attention kernels dequantize on load).
fp8 needs a GPU that has it (compute capability 8.9 or later): the Triton interpreter cannot run
fp8, so on a CPU only int8 runs; ``roofline check --compile`` compiles the fp8 path for sm_90.
"""

from __future__ import annotations

import torch

from roofline.errors import RooflineError
from roofline.layer import model_ops
from roofline.parallel import shard, valid_tp
from roofline.precision import weight_format as precision_format
from roofline.workload import INT4_GROUPS

from . import linear_fp4, linear_fp8, linear_int4, linear_int8, quant_weight  # noqa: F401  (they register formats)
from .env import device_label, fp8_supported
from .quant_weight import (FORMATS, QuantExperts, QuantWeight, check_group, op_missing, slice_experts,
                           weight_format)

KV_DTYPES = ("int8", "fp8")                   # 8-bit KV caches
KV_QMAX = {"int8": 127.0, "fp8": 448.0}       # the largest magnitude each stores (fp8 e4m3: 448)
KV_TORCH = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}


def weight_label(w) -> str:
    """How a record says a ``QuantWeight`` / ``QuantExperts``'s format: the precision registry's label ("int8 (per
    channel)", "int4 (g128, zero points)", "fp8 e4m3 (128x128 blocks)", "mxfp4 (blocks of 32, e8m0 scales)")."""
    return precision_format(w.dtype, w.group_size or None, w.zeros is not None).describe()


def expert_weights_config(w, backend: str) -> dict:
    """What a sweep's record says of the routed experts' weights: {} for float ones; for ``QuantExperts`` the
    format as a linear's config says it (``weight_label``) and, on the torch backend, ``impl``: each expert's GEMM
    (``QuantExperts.torch_impl``)."""
    if not isinstance(w, QuantExperts):
        return {}
    label = weight_label(w)
    if backend == "triton":
        return {"weights": label}
    return {"weights": label, "impl": f"per expert: {w.torch_impl or 'not prepared'}"}


def quantize_experts(w: torch.Tensor, dtype: str, *, group_size: int | None = None, zero_point: bool = False,
                     name: str = "experts") -> QuantExperts:
    """Quantize E float weights ``w`` [E, K, N] expert by expert with ``quantize_weight`` (any registered weight
    format: int8 a scale per output channel per expert, int4 groups of ``group_size`` input rows, fp8 per channel,
    per tensor or 128 x 128 blocks, mxfp4 / nvfp4 micro-blocks), stacked along a leading E."""
    if w.dim() != 3:
        raise ValueError(f"{name} must be [E, K, N] expert weights, got shape {list(w.shape)}.")
    qs = [quantize_weight(w[e], dtype, group_size=group_size, zero_point=zero_point, name=name)
          for e in range(w.shape[0])]
    q0 = qs[0]
    stack = lambda attr: None if getattr(q0, attr) is None else torch.stack([getattr(q, attr) for q in qs])  # noqa: E731
    return QuantExperts(q0.dtype, stack("qweight"), stack("scales"), stack("zeros"), q0.in_features, q0.out_features,
                        q0.group_size, tensor_scale=stack("tensor_scale"), act=q0.act)


def check_weight_dtype(name) -> str:
    """``name`` as a weight format our kernels quantize to (``kernels.quant_weight.FORMATS``: int8, int4, the fp8
    ones, mxfp4, nvfp4); any other in one line naming them."""
    key = str(name).strip().lower()
    if key not in FORMATS:
        raise RooflineError(f"our kernels quantize weights to {', '.join(FORMATS)}, but {name!r} was given.")
    return key


def quantize_weight(w: torch.Tensor, dtype: str, *, group_size: int | None = None, zero_point: bool = False,
                    name: str = "w") -> QuantWeight:
    """Quantize a float weight ``w`` [K, N] (any strides) to the registered format ``dtype`` (int8 / int4: scales in
    ``w``'s dtype; int4 takes ``group_size`` and ``zero_point``; fp8: fp32 scales; mxfp4 / nvfp4: their own)."""
    d = check_weight_dtype(dtype)
    if zero_point and d != "int4":
        raise RooflineError(f"{d} weights are symmetric: a zero point is int4's.")
    if d == "int4":
        return linear_int4.quantize(w, group_size=check_group(group_size), zero_point=zero_point, name=name)
    return weight_format(d).quantize(w)


def quantized_weights(cfg, sh=None) -> list:
    """(op name, weight key, kind, K, N) of every weight ``quantized_ops`` names: its float [K, N] (one rank's under
    the ``roofline.parallel.Shard`` ``sh``; an expert's for the routed experts)."""
    out = []
    for o in model_ops(cfg, sh):
        if o.kind == "linear":
            out += [(o.name, ws.key, "linear", *ws.shape) for ws in o.weights if ws.role == "linear"]
        elif o.kind == "mla_up":
            out += [(o.name, ws.key, "mla_up", *ws.shape) for ws in o.weights]
        elif o.kind == "experts":
            out += [(f"experts {ws.key.split('_')[1]}_proj", ws.key, "experts", *ws.shape[1:])
                    for ws in o.weights if ws.role == "experts"]
    return out


def quantized_ops(cfg, sh=None) -> list:
    """(op name, weight key, kind, in-features) of every weight the workload model charges in the weight dtype
    (one rank's in-features under the ``roofline.parallel.Shard`` ``sh``)
    (``roofline.workload``): each "linear" op's weight (q/k/v/o, the dense MLP, the shared experts, lm_head) and
    the routed experts' gate/up [E, H, I] and down [E, I, H]; latent attention's kv_b_proj [R, H * (nope + v)]
    (kind "mla_up": prefill runs it as a quantized linear, decode reads its dequantized copy,
    ``ABSORBED_KV_B``). The router, the shared-expert gate, norms, biases and the embedding stay in the
    activation dtype."""
    return [(n, key, kind, K) for n, key, kind, K, _ in quantized_weights(cfg, sh)]


def check_model_groups(cfg, group_size: int) -> None:
    """One line naming the model's first quantized weight (``quantized_ops``) whose in-features ``group_size``
    does not divide."""
    ins = {n: k for n, _, _, k in quantized_ops(cfg)}
    bad = [(n, k) for n, k in ins.items() if k % group_size]
    if bad:
        n, k = bad[0]
        fits = [g for g in INT4_GROUPS if all(v % g == 0 for v in ins.values())]
        stuck = [f"{m}'s {v}" for m, v in ins.items() if all(v % g for g in INT4_GROUPS)]
        why = f"none divides {', '.join(stuck[:3])} in-features" if stuck else "no one size divides every weight"
        hint = (f"give --group-size {' or '.join(map(str, fits))}" if fits else
                f"no int4 group size ({', '.join(map(str, INT4_GROUPS))}) fits every weight ({why}): use int8 "
                "weights")
        raise RooflineError(f"int4 group size {group_size} does not divide {cfg.name}'s {n} in-features ({k}): "
                            f"{hint}.")


def _cut_by_shards(fmt, full: dict, per: dict) -> list:
    """(op name, axis, per-rank size, full size, features per scale) of each split dimension whose per-rank size is
    not a whole number of ``fmt``'s scale groups / blocks (``Scales.k`` input features, ``Scales.n`` output ones)."""
    bad = []
    for n, (k, nn) in per.items():
        K, N = full[n]
        for axis, r, f, c in (("in-features", k, K, fmt.scales.k), ("out-features", nn, N, fmt.scales.n)):
            if c > 1 and r < f and r % c:
                bad.append((n, axis, r, f, c))
    return bad


def check_tp_scales(cfg, tp: int, fmt) -> None:
    """One line when weight format ``fmt`` (a ``roofline.precision`` Format: its scales' k and n) cannot be sharded
    under ``--tp tp``: every split dimension of a rank's shard (K / tp input rows of a row-parallel weight: o_proj,
    down_proj, the experts' down_proj; N / tp output columns of a column-parallel one, and lm_head's vocab slice)
    must hold whole scale groups / blocks (int4's groups, FP4's micro-blocks, fp8's 128 x 128 blocks:
    ``slice_quant``). Per-channel and per-tensor scales always shard. Says which --tp (int4: which group sizes)
    would fit."""
    if tp <= 1 or not fmt.quantized:
        return
    full = {n: (k, nn) for n, _, _, k, nn in quantized_weights(cfg)}
    dims = lambda t: {n: (k, nn) for n, _, _, k, nn in quantized_weights(cfg, shard(cfg, t))}  # noqa: E731
    per = dims(tp)
    bad = _cut_by_shards(fmt, full, per)
    if not bad:
        return
    n, axis, r, f, c = bad[0]
    int4 = fmt.name == "int4"
    gs = [g for g in INT4_GROUPS if int4 and all(k % g == 0 for k, _ in per.values())]
    tps = [t for t in valid_tp(cfg) if t > 1 and not _cut_by_shards(fmt, full, dims(t))]
    plain = [m for m in FORMATS if m != fmt.name and precision_format(m).element == fmt.element
             and precision_format(m).scales.k == 0] or ["int8"]
    hints = ([f"--group-size {' or '.join(map(str, gs))}"] if gs else []) + \
            ([f"--tp {' or '.join(map(str, tps))}"] if tps else []) + [f"{' or '.join(plain)} weights", "no --tp"]
    unit = "groups" if int4 or fmt.scales.n <= 1 else "blocks"
    what = f"int4 group size {c}" if int4 else f"{fmt.name}'s scale {unit[:-1]} of {c}"
    raise RooflineError(f"{what} does not divide {cfg.name}'s {n} {axis} per rank at --tp {tp} ({r} of {f}): a "
                        f"rank's shard must hold whole {unit}; give {', or '.join(hints)}.")


def check_tp_groups(cfg, tp: int, group_size: int) -> None:
    """``check_tp_scales`` for int4 weights in groups of ``group_size`` (the int4 flags' check)."""
    check_tp_scales(cfg, tp, precision_format("int4", group_size))


def slice_quant(q, axis: str, start: int, stop: int):
    """Rows ``start:stop`` of a quantized weight along the float weight's ``axis``, as a new ``QuantWeight`` /
    ``QuantExperts`` (copies; nothing prepared): "out" (N: a column-parallel split, or a vocab slice), "in" (K: a
    row-parallel split) or "experts" (E). Exact: the result dequantizes to the same slice of the full weight's
    dequantization. "out" and "in" are the format's (``register_format``'s ``slice``): per-output-channel scales
    follow N and stay whole on an "in" slice (as a row-parallel layer's scales are replicated in vLLM); scales over
    groups or blocks of features follow their axis, so a slice must keep whole ones (``check_tp_scales`` says so
    before anything runs; a ValueError here)."""
    if axis == "experts":
        if not isinstance(q, QuantExperts):
            raise ValueError("an 'experts' slice needs a QuantExperts.")
        return slice_experts(q, start, stop)
    if axis not in ("out", "in"):
        raise ValueError(f"slice_quant's axis is 'out', 'in' or 'experts', not {axis!r}.")
    return weight_format(q.dtype).slice(q, axis, start, stop)


def pad_out(q: QuantWeight, n: int) -> QuantWeight:
    """``q`` with zero output channels appended up to ``n`` (a vocabulary padded to a multiple of the ranks), by
    its format (``register_format``'s ``pad_out``): they dequantize to 0."""
    if n <= q.out_features:
        return q
    return weight_format(q.dtype).pad_out(q, n)


def quantize_model_weights(cfg, w: dict, prec, *, backend: str = "triton") -> dict:
    """The model's weight dict with every weight held as ``prec`` runs it (a ``kernels.run_precision.RunPrecision``:
    each op's format is ``prec.run.weight(op)``): a linear's weight quantized to a ``QuantWeight``, the routed
    experts' to a ``QuantExperts``, lm_head likewise; one already held in its format (a checkpoint's, as stored)
    kept; one held in another (or quantized where the run holds a float) dequantized first. Norms, the router and
    the embedding stay in the activation dtype. A tied lm_head gets its own quantized copy of embed.t().
    Latent attention's kv_b_proj becomes a ``QuantWeight`` (prefill's up-projection) plus, under
    ``ABSORBED_KV_B``, that weight dequantized once into the activation dtype: absorbed decode's W_UK / W_UV
    (``absorbed_kv_b``). ``backend="torch"`` also prepares what the torch backend runs (per expert for the
    routed experts)."""
    act = w["final_norm"].dtype
    fmts = {}                                          # weight key -> (its op's run format or None, the op's kind)
    for o in model_ops(cfg):
        if o.kind in ("linear", "mla_up", "experts"):
            f = prec.run.weight(o)
            for ws in o.weights:
                if ws.role in ("linear", "experts"):
                    fmts[ws.key] = (f if f is not None and f.quantized else None, o.kind)
    for g in {f.group_size for f, _ in fmts.values() if f is not None and f.name == "int4"}:
        check_model_groups(cfg, g)       # one line naming a weight a group does not tile (FP4 blocks: its quantize)

    def held(t, key):
        f, kind = fmts.get(key, (None, ""))
        quantized = isinstance(t, (QuantWeight, QuantExperts))
        if quantized and f is not None and t.dtype == f.name and (f.name != "int4" or (
                t.group_size == f.group_size and (t.zeros is not None) == f.zero_point)):
            return t
        if quantized:
            t = t.dequantize(act)
        if f is None:
            return t
        kw = dict(group_size=f.group_size or None, zero_point=f.zero_point, name=key)
        return quantize_experts(t, f.name, **kw) if kind == "experts" else quantize_weight(t, f.name, **kw)

    def layer(lw):
        ql = {k: held(v, k) for k, v in lw.items()}
        for k, v in list(ql.items()):
            if fmts.get(k, (None, ""))[1] == "mla_up" and isinstance(v, QuantWeight):
                ql[ABSORBED_KV_B] = absorbed_kv_b(v, act)
        return ql
    out = {k: v for k, v in w.items() if k != "layers"}
    out["layers"] = [layer(lw) for lw in w["layers"]]
    out["lm_head"] = held(w["lm_head"], "lm_head")
    if backend == "torch":
        prepare_model_torch(out)
    return out


def prepare_model_torch(w: dict) -> dict:
    """``prepare_torch`` every quantized weight of a model's weight dict (per expert for ``QuantExperts``): what
    ``quantize_model_weights(backend="torch")`` does, and what a rank does after sharding quantized weights."""
    for lw in w["layers"]:
        for v in lw.values():
            if isinstance(v, QuantWeight):
                prepare_torch(v)
            elif isinstance(v, QuantExperts):
                for e in range(v.n_experts):
                    prepare_torch(v.expert(e))
    if isinstance(w.get("lm_head"), QuantWeight):
        prepare_torch(w["lm_head"])
    return w


# ---------------------------------------------------------------- latent attention's absorbed kv_b_proj

ABSORBED_KV_B = "wkv_b_absorbed"   # a layer's kv_b_proj dequantized at load: what absorbed MLA decode reads


def absorbed_kv_b(wkv_b, act_dtype: torch.dtype) -> torch.Tensor:
    """kv_b_proj [R, H * (nope + v)] as absorbed decode reads it (W_UK and W_UV, per head, ``kernels.mla``): a
    float weight as it is; a ``QuantWeight`` dequantized ONCE, at load, into ``act_dtype``. NB: decode then
    reads R * H * (nope + v) elements of the activation dtype per step (no scales), which is what
    ``roofline.workload`` charges the decode "mla_up" op; prefill's up-projection reads the quantized weight
    (a quantized linear's cost). vLLM's MLA does the same (``W_UK_T`` / ``W_UV`` dequantized in
    ``process_weights_after_loading``); the price is a second, activation-dtype copy of kv_b_proj in memory."""
    if isinstance(wkv_b, QuantWeight):
        return wkv_b.dequantize(act_dtype)
    return wkv_b


def decode_kv_b(w: dict) -> torch.Tensor:
    """A layer's kv_b_proj [R, H * (nope + v)] for absorbed decode: the copy dequantized at load when the weights
    are quantized (``ABSORBED_KV_B``), else the float weight itself."""
    return w[ABSORBED_KV_B] if ABSORBED_KV_B in w else w["wkv_b"]


# ---------------------------------------------------------------- the torch backend's quantized GEMMs

def prepare_torch(qw: QuantWeight) -> QuantWeight:
    """Choose and prepare what the torch backend runs for ``qw`` (idempotent); RooflineError when int4 has no op.

    int8: ``aten._weight_int8pack_mm(x, int8 [N, K], scales [N])`` (CPU, and CUDA where this torch has it).
    int4: CPU ``_weight_int4pack_mm_for_cpu`` (torch >= 2.5) on ``_convert_weight_to_int4pack_for_cpu``'s
    packing; CUDA ``_weight_int4pack_mm`` (bf16 tinygemm). Scales and zero points go as tinygemm's
    [K/g, N, 2] (w = (q - 8) x scale + zero: exactly linear_int4's convention). A shape the op refuses
    (the CPU op wants N a multiple of 16) runs the dequantize reference, labelled so.
    """
    if qw.torch_impl or qw.device.type == "meta":
        return qw
    weight_format(qw.dtype).prepare_torch(qw)
    return qw


def torch_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y[..., N] = x[..., K] @ dequant(qw) (+ bias[N], added after) with what ``prepare_torch`` chose."""
    prepare_torch(qw)
    return weight_format(qw.dtype).torch_linear(x, qw, bias)


def check_torch_int4(device) -> None:
    """A one-line RooflineError when this torch has no int4 GEMM for ``device`` (before anything runs)."""
    ops = quant_weight.aten()
    if torch.device(device).type == "cpu":
        if not (hasattr(ops, "_weight_int4pack_mm_for_cpu") or hasattr(ops, "_weight_int4pack_mm")):
            raise op_missing("int4 weights", "_weight_int4pack_mm_for_cpu", "2.5")
    elif not hasattr(ops, "_weight_int4pack_mm"):
        raise op_missing("int4 weights", "_weight_int4pack_mm", "2.4")


# ---------------------------------------------------------------- 8-bit KV caches

def check_kv_dtype(kv_dtype: str, device) -> str:
    """``kv_dtype`` as a KV_DTYPES key; fp8 on a device without fp8 is a one-line RooflineError."""
    key = str(kv_dtype).strip().lower()
    if key not in KV_DTYPES:
        raise RooflineError(f"an 8-bit KV cache is one of {', '.join(KV_DTYPES)}, but {kv_dtype!r} was given.")
    if key == "fp8" and not fp8_supported(device):
        raise RooflineError(f"an fp8 (e4m3) KV cache needs a GPU with fp8 (compute capability 8.9+: Ada, Hopper); "
                            f"{device_label(device)} has none: use --kv-dtype int8.")
    return key


def check_model_kv(cfg, kv_dtype) -> None:
    """A latent cache (MLA) has no 8-bit form: a one-line RooflineError for an 8-bit ``kv_dtype`` on such a model.
    (Sinks take one: both backends dequantize it, ``kernels.sinks``.)"""
    if cfg.mla and kv_dtype in KV_DTYPES:
        raise RooflineError(f"{cfg.name}: an 8-bit KV cache is not implemented for a latent cache: drop --kv-dtype.")


def kv_storage(kv_dtype: str) -> torch.dtype:
    return KV_TORCH[kv_dtype]


def kv_dtype_of(cache: torch.Tensor) -> str:
    """"int8" / "fp8" for an 8-bit cache tensor, "" for a float one."""
    return next((k for k, v in KV_TORCH.items() if cache.dtype == v), "")


def quantize_kv_rows(x: torch.Tensor, kv_dtype: str) -> tuple:
    """(values, fp32 scales) of ``x`` [..., D] quantized per row (per token per head): scale = absmax / QMAX,
    value = x / scale rounded (int8: half away from zero, as the kernel's truncation of x + 0.5 sign(x);
    fp8: the cast's round to nearest even). Arithmetic in fp32, as the kernel does it."""
    xf = x.float()
    amax = xf.abs().amax(-1)
    qmax = KV_QMAX[kv_dtype]
    inv = torch.where(amax > 0, qmax / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.zeros_like(amax))
    y = xf * inv[..., None]
    if kv_dtype == "int8":
        q = torch.trunc(y + torch.where(y >= 0, 0.5, -0.5)).clamp(-127, 127).to(torch.int8)
    else:
        q = y.clamp(-qmax, qmax).to(KV_TORCH["fp8"])
    return q, amax / qmax


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """values [..., D] x scale [...] -> ``dtype``."""
    return (q.float() * scale.float()[..., None]).to(dtype)
