"""The compile check's variants, discovered by running the real launchers on meta tensors.

For each target GPU (``TARGETS``: sm_80 = A100, 108 SMs; sm_90 = H100/H200, 132 SMs) every op of
the Llama-2-7B and Llama-3-8B prefill and decode phases (``kernels.runners``) runs on
``device="meta"`` inside ``_launch.recording(num_sms=...)``: the launchers choose block sizes,
split counts, warps, stages and grids exactly as on that GPU, and hand each launch to the
recorder instead of running it. Triton's own argument binder then turns each launch into what
the JIT would compile (signature, constexprs, divisibility attributes), so the variants are
the launchers' own, never a copy of their rules. Distinct compilations become ``Variant``s;
the grids of every launch that maps to one are kept for the grid-limit check.

The per-op-kind extras (``kernels.compile_launches``, entries of ``kernels.runner_registry.LAUNCHES``: a kind
registered elsewhere, a test file included, adds its own). Other dense architectures (issue 20): attention with a sliding window and / or
logit softcapping, linears with a bias (float, int8, int4) and GeGLU, on the same shapes. GPT-OSS's attention
with sinks, with and without a window, on the same shapes too: the SINKS variants beside
their no-sink twins.

DeepSeek-V3's MLA decode (issue 21): ``kernels.mla.mla_decode`` at H 128, rank 512, rope 64
in bf16 and fp16, at every decode combo's batch and context.

The fused MoE expert GEMM (issue 21): ``kernels.moe.moe_experts`` at Mixtral-8x7B's and
GPT-OSS-20B's expert shapes, in every dtype, at every combo's tokens (skinny at decode, tiled at prefill); and
with quantized experts (``MOE_QUANT``) in the 16-bit dtypes: int8, int4 (Mixtral g128, GPT-OSS g32: MXFP4's
block), int4 with zero points (g64) in bf16.

Quantized passes (``QUANT_PASSES``): the same shapes again with int8 / int4 weights and an 8-bit KV
cache (the linears, kv_append and attention only), in the 16-bit dtypes a GPU runs them in: int8
weights with an int8 KV cache; int4 (g128) with an fp8 KV cache where the target has fp8 (sm_90;
int8 on sm_80); int4 (g64, zero points) in bf16. So ``roofline check --compile`` compiles the fp8
path the interpreter cannot run.

What ``roofline check`` launches (``check_launches``, issue 21): its kernel and quantization checks with the
full set's shapes and explicit block configs (``roofline check --full``: M=1000 N=1100 K=700 takes 128x128x64
tiles with split-K), replayed on small CPU tensors under the recorder (nothing runs; the references are
computed and thrown away); the full set adds its model checks (the tiny model) and every dtype. ``--model
check`` compiles only these.

The full set also runs every preset of ``roofline.models.PRESETS`` (dense, MoE, MLA, Gated DeltaNet hybrids, DSA;
tiny ones included) through its runners on ``PRESET_GRID`` (Llama-2-7B and Llama-3-8B keep ``FULL``); GPT-OSS's
attention runs the Triton kernels' sink variants there too. A runner whose torch path reads tensor values cannot run on meta tensors: it
launches no Triton kernel and is listed as skipped, as is a quantized pass a model refuses (int4 groups that do
not divide K).

This module needs Triton's compiler-side objects (``JITFunction``, not the interpreter's
wrapper): ``kernels.compile_check`` runs it in a process with ``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass, field

import torch

import kernels
from roofline.layer import model_ops
from roofline.models import PRESETS, load_model

from ._launch import kernel_name, recording
from .env import FP8_SM as FP8_CAPABILITY   # a target's capability number from which fp8 runs (89)
from .runner_registry import LAUNCHES, NEEDS, MetaCombo

MODELS = ("llama-2-7b", "llama-3-8b")
DTYPES = ("bf16", "fp16", "fp32")
PHASES = ("prefill", "decode")
FULL = dict(batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), contexts=(128, 256, 512, 1024, 2048, 4096, 8192))
QUICK = dict(batches=(1, 8, 64, 256), contexts=(128, 1024, 8192))
PRESET_GRID = dict(batches=FULL["batches"], contexts=QUICK["contexts"])   # the other presets in the full set
CHECK = "check"      # the pseudo-model of ``--model``: what ``roofline check`` launches
GRID_LIMITS = (2**31 - 1, 65535, 65535)
QUANT_OPS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head", "kv_append", "experts",
             "attention", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj")     # the last four: MLA's projections
# (dtypes it runs in, make_runners keywords); "fp8" KV falls back to int8 on a target without fp8
QUANT_PASSES = ((("bf16", "fp16"), dict(weight_dtype="int8", kv_dtype="int8")),
                (("bf16", "fp16"), dict(weight_dtype="int4", kv_dtype="fp8")),
                (("bf16",), dict(weight_dtype="int4", group_size=64, zero_point=True)))


@dataclass(frozen=True)
class Target:
    name: str            # "sm_90"
    capability: int      # 90
    gpus: str            # what it stands for
    sms: int             # the SM count the launchers are told
    smem_block: int      # the per-block shared memory Triton checks at load (OutOfResources above it)
    smem_sm: int         # shared memory per SM (occupancy)
    regs_sm: int = 65536
    regs_block: int = 65536
    threads_sm: int = 2048
    blocks_sm: int = 32


TARGETS = {
    "sm_80": Target("sm_80", 80, "A100", 108, smem_block=166_912, smem_sm=167_936),
    "sm_90": Target("sm_90", 90, "H100/H200", 132, smem_block=232_448, smem_sm=233_472),
}


@dataclass
class Variant:
    """One compilation: a kernel, its specialised signature, constexprs and options, on one target."""

    target: str
    kernel: str
    module: str
    dtype: str                  # the dtype of the shapes that launched it
    signature: dict             # arg name -> Triton type ("*bf16", "i32", "constexpr")
    constexprs: dict            # (arg index,) -> value
    attrs: dict                 # (arg index,) -> [["tt.divisibility", 16]]
    num_warps: int
    num_stages: int
    launches: list = field(default_factory=list)   # (grid, tag) of every launch that compiles to this
    error: str = ""             # the launch could not be bound to the kernel (nothing to compile)

    @property
    def key(self) -> tuple:
        return (self.target, self.module, self.kernel, self.error, tuple(sorted(self.signature.items())),
                tuple(sorted((k, repr(v)) for k, v in self.constexprs.items())),
                tuple(sorted((k, repr(v)) for k, v in self.attrs.items())), self.num_warps, self.num_stages)

    @property
    def config(self) -> str:
        """The launcher's own keyword constexprs (block sizes, flags), then warps and stages."""
        names = list(self.signature)
        kw = [f"{names[p[0]]}={v}" for p, v in sorted(self.constexprs.items())
              if names[p[0]].isupper() and names[p[0]] not in ("UPCAST",)]
        wide = [f"{n}:i64" for n, t in self.signature.items() if t == "i64"]   # past 2^31: int64 arguments
        return " ".join(kw + wide + [f"w{self.num_warps}", f"s{self.num_stages}"])

    @property
    def max_grid(self) -> tuple:
        """The grid of the launch with the most programs."""
        return max((g for g, _ in self.launches), key=lambda g: g[0] * g[1] * g[2])

    def task(self) -> dict:
        """What a compile worker needs (picklable, no Triton objects)."""
        return dict(module=self.module, kernel=self.kernel, signature=self.signature,
                    constexprs=list(self.constexprs.items()), attrs=list(self.attrs.items()),
                    options=dict(num_warps=self.num_warps, num_stages=self.num_stages))


def shapes(quick: bool, models=None, dtypes=DTYPES, phases=PHASES) -> list:
    """(model, phase, batch, context, dtype) of the quick or the full set. ``models`` None: ``MODELS`` in the
    quick set, every preset in the full one (``MODELS`` on ``FULL``, the others on ``PRESET_GRID``)."""
    if models is None:
        models = MODELS if quick else tuple(MODELS) + tuple(m for m in PRESETS if m not in MODELS)
    models = [m for m in models if m != CHECK]
    top = {m: load_model(m).max_context for m in models}   # Llama-2 stops at 4,096 tokens
    grid = lambda m: QUICK if quick else FULL if m in MODELS else PRESET_GRID  # noqa: E731
    return [(m, ph, b, c, dt) for m in models for dt in dtypes for ph in phases
            for b in grid(m)["batches"] for c in grid(m)["contexts"] if c + (ph == "decode") <= top[m]]


def check_parts(quick: bool, models=None, dtypes=DTYPES) -> tuple:
    """(dtype, part) of ``roofline check`` that ``check_launches`` replays: with ``quick``, the kernel and
    quantization checks in bf16 (the shapes and block configs of ``roofline check --dtype bf16 --full``); the
    full set adds the model checks and every dtype. None when ``models`` is given without ``CHECK``."""
    if models is not None and CHECK not in models:
        return ()
    dts = [d for d in (("bf16",) if quick and models is None else DTYPES) if d in dtypes]
    parts = ("kernels", "quant") if quick and models is None else ("kernels", "quant", "model", "quant model")
    return tuple((d, p) for d in dts for p in parts)


def check_launches(rec, parts, skipped: list) -> None:
    """Replay ``roofline check --full``'s checks (``parts`` from ``check_parts``) under the recorder ``rec``,
    on CPU tensors: the launchers size every launch for the recorder's SM count and nothing runs."""
    from . import check as CK   # these import triton: deferred, the variant list reads without it
    from .check_deltanet import deltanet_rows
    from ._common import torch_dtype
    from .backend import get_ops

    ops, cpu = get_ops("triton"), torch.device("cpu")
    runs = {"kernels": lambda dt: (*CK._kernel_checks(ops, dt, cpu, False), *deltanet_rows(ops, dt, cpu)),
            "quant": lambda dt: CK._quant_checks(ops, dt, cpu, False),
            "model": lambda dt: CK._model_checks("triton", dt, cpu, False),
            "quant model": lambda dt: CK._quant_model_checks("triton", dt, cpu, False)}
    for dtype, part in parts:
        rec.context = dict(model=CHECK, phase="--full", dtype=dtype, op=part)
        try:
            for _ in runs[part](torch_dtype(dtype)):
                pass
        except (RuntimeError, ValueError, NotImplementedError) as e:   # garbage outputs fed on: stop this part
            skipped.append(f"{CHECK} --full {dtype} {part}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")


def record(target: Target, combos, checks=(), skipped=None) -> list:
    """Every launch of every op of every combo, on meta tensors, as the launchers size them for ``target``, then
    ``roofline check``'s (``checks``: ``check_parts``). What cannot run on meta is appended to ``skipped``."""
    from . import compile_launches  # noqa: F401  (registers the per-kind extra launches; these import triton)
    from ._common import torch_dtype
    from .runners import make_runners

    meta = torch.device("meta")
    skipped = [] if skipped is None else skipped
    cfgs = {}

    def run(runners, where, tag=""):
        for r in runners:
            if r.name != "layer":       # the layer runs the same launchers again
                rec.context = dict(where, op=f"{r.name}{tag}")
                try:
                    r.fn()
                except Exception as e:  # noqa: BLE001 - a torch path reading values on meta (or
                    # a runner bug, e.g. MLA + int4): listed, the rest still recorded
                    note = f"{where['model']} {where['phase']} {r.name}{tag}: {type(e).__name__}: " \
                           f"{(str(e).splitlines() or [''])[0][:100]}"
                    if not any(s.split(": ")[0] == note.split(": ")[0] for s in skipped):
                        skipped.append(note)

    with recording(target.sms) as rec:
        for model, phase, batch, context, dtype in combos:
            cfg = cfgs.setdefault(model, load_model(model))
            where = dict(model=model, phase=phase, b=batch, ctx=context, dtype=dtype)
            run(make_runners(cfg, phase, batch, context, dtype=dtype, device=meta), where)
            own = [o.name for o in model_ops(cfg) if o.name in QUANT_OPS]
            for dts, qkw in QUANT_PASSES:
                if dtype not in dts:
                    continue
                if qkw.get("kv_dtype") == "fp8" and target.capability < FP8_CAPABILITY:
                    qkw = dict(qkw, kv_dtype="int8")
                if cfg.mla:       # a latent cache has no 8-bit form: its quantized weights compile without it
                    qkw = {k: v for k, v in qkw.items() if k != "kv_dtype"}
                tag = " ".join(f"{k.split('_')[0]}={v}" for k, v in qkw.items() if k.endswith("dtype"))
                try:
                    runners = make_runners(cfg, phase, batch, context, dtype=dtype, device=meta, ops=own, **qkw)
                except Exception as e:  # noqa: BLE001 - an int4 group that does not divide K (said, skipped)
                    note = f"{model} {tag}: {type(e).__name__}: {str(e)[:120]}"
                    if note not in skipped:
                        skipped.append(note)
                    continue
                run(runners, where, f" {tag}")
            if model not in MODELS:         # the launches below are Llama-shaped extras; presets reach their own
                continue
            combo = MetaCombo(where, cfg, phase, batch, context, torch_dtype(dtype), target)
            for extra in LAUNCHES.values():  # what the runners do not reach, per op kind (kernels.compile_launches)
                extra(rec, combo)
        check_launches(rec, checks, skipped)
    return rec.launches


class BinderMissing(RuntimeError):
    """The installed Triton has no argument binder this module knows how to call."""


def _binder(fn, backend, cache: dict):
    if fn not in cache:
        try:
            from triton.runtime.jit import create_function_from_signature
        except ImportError as e:
            raise BinderMissing(f"triton.runtime.jit.create_function_from_signature is missing ({e})") from None
        if not hasattr(fn, "_pack_args") or not hasattr(fn, "params"):
            raise BinderMissing(f"{type(fn).__name__} has no _pack_args/params (is TRITON_INTERPRET set?)")
        cache[fn] = create_function_from_signature(fn.signature, fn.params, backend)
    return cache[fn]


def variants(target: Target, launches) -> list:
    """Group ``launches`` into distinct compilations for ``target`` (Triton's own specialisation)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", target.capability, 32))
    binders, out = {}, {}
    for ln in launches:
        fn = ln.kernel
        bind = _binder(fn, backend, binders)
        try:
            bound, spec, opts = bind(*ln.args, **ln.constexprs, **ln.options)
            options, signature, constexprs, attrs = fn._pack_args(backend, dict(ln.options), bound, spec, opts)
        except AttributeError as e:
            raise BinderMissing(f"{type(e).__name__}: {e}") from None
        except (TypeError, KeyError) as e:     # the launch does not fit the kernel's parameters: a launcher bug
            v = Variant(target.name, kernel_name(fn), fn.__module__, ln.context.get("dtype", ""), {}, {}, {},
                        int(ln.options.get("num_warps", 4)), int(ln.options.get("num_stages", 3)),
                        error=f"the launch does not bind to the kernel ({type(e).__name__}: {e})")
        else:
            v = Variant(target.name, kernel_name(fn), fn.__module__, ln.context.get("dtype", ""),
                        dict(signature), dict(constexprs), dict(attrs),
                        int(options.num_warps), int(options.num_stages))
        v = out.setdefault(v.key, v)
        v.launches.append((ln.grid, ln.tag))
    return list(out.values())


def grid_problems(v: Variant) -> list:
    """Launches of ``v`` whose grid is over a CUDA limit (x: 2^31 - 1; y, z: 65,535)."""
    bad = []
    for grid, tag in v.launches:
        over = [f"axis {i} = {g} > {lim}" for i, (g, lim) in enumerate(zip(grid, GRID_LIMITS)) if g > lim]
        if over:
            bad.append(f"grid {grid} at {tag}: " + ", ".join(over))
    return bad


def all_kernels() -> dict:
    """name -> JITFunction of every @triton.jit function defined in the kernels package."""
    from triton.runtime.jit import JITFunction

    out = {}
    for mod in pkgutil.iter_modules(kernels.__path__):
        if mod.name in ("check", "compile_check", "variants", "__main__"):
            continue
        m = importlib.import_module(f"kernels.{mod.name}")
        for name, obj in vars(m).items():
            fn = getattr(obj, "fn", None)
            if isinstance(obj, JITFunction) and getattr(fn, "__module__", None) == m.__name__:
                out[name] = obj
    return out


def unreached(launched: set, kernels: dict, capability: int = 10 ** 6) -> list:
    """Kernels no launcher reaches: neither launched nor called from a launched kernel's source, leaving out those
    launched only on targets above ``capability`` (the highest target checked: ``runner_registry.NEEDS``)."""
    srcs = []
    for name in launched:
        fn = kernels.get(name)
        if fn is not None:
            srcs.append(getattr(fn, "src", None) or inspect.getsource(fn.fn))
    return sorted(n for n in kernels if n not in launched and NEEDS.get(n, 0) <= capability
                  and not any(re.search(rf"\b{re.escape(n)}\s*\(", s) for s in srcs))
