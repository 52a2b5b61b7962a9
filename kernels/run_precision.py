"""What a run of our kernels holds each module in: the precision asked for (the checkpoint's own, with the flags
over it: ``roofline.layer.precision_of`` and ``Precision.with_flags``) mapped onto the formats our kernels run,
with one sentence for every module where the two differ.

    rp = run_precision(cfg, "bf16")                   # the checkpoint's own precision, as our kernels run it
    rp = run_precision(cfg, "bf16", weight="int4", group_size=64)      # a flag over it
    rp.run         # roofline.precision.Precision: what the weights are held in; every cost of the run is of it
    rp.chosen      # what was asked for (the checkpoint's, with the flags over it)
    rp.notes       # e.g. ("experts: int4 GPTQ (g128) in the checkpoint, run as int4 (g128, zero points): ...",)

Mapping, per module class (``roofline.precision.modules.MODULES``):

- a format our kernels register (``kernels.quant_weight.FORMATS``: int8, int4, the fp8 ones, mxfp4, nvfp4) runs as
  itself; GPTQ / AWQ int4 runs as our int4 with zero points of the same group (``kernels.checkpoint_quant`` converts
  the stored tensors exactly); any other quantized format is refused in one line, naming the ones that run.
- the activations: what that format's kernel quantizes them to (``acts`` of its registry entry: fp8's W8A8 GEMM,
  per token or per 1 x 128 group), else the activation dtype (weight-only: dequantized in registers). A checkpoint
  that calibrated static activation scales (compressed-tensors, ModelOpt) is run with dynamic ones: said.
- a quantized class whose ops our kernels take only as floats (the router's gate, the embedding) runs in the
  activation dtype: said.
- plain float weights are held in the activation dtype (what our kernels compute in).
- the KV cache: our 8-bit caches (``kernels.quant.KV_DTYPES``: int8, fp8 e4m3, an fp32 scale per token and KV head);
  a checkpoint's per-tensor fp8 cache runs as our per-token one (said); e5m2 and other formats are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from roofline.errors import RooflineError
from roofline.layer import check_runnable, model_ops, module_classes, precision_of
from roofline.models import ModelConfig
from roofline.precision import Precision, kv_format, run_names, weight_format
from roofline.precision.modules import PLAIN_FLAG, WEIGHT_ROLES, module_pairs

from .env import device_label, fp8_supported
from .moe import QUANT_CODES
from .quant import KV_DTYPES, check_kv_dtype, check_model_kv, check_tp_scales   # (kernels.quant imports every format's module)
from .quant_weight import FORMATS

QUANTIZED_KINDS = ("linear", "mla_up", "experts")   # the op kinds whose runners take a quantized weight
KV_RUN = {"int8": "int8", "e4m3": "fp8"}            # a KV format's element -> our 8-bit cache of it


@dataclass(frozen=True)
class RunPrecision:
    """``chosen``: the precision asked for; ``run``: what our kernels hold each module in (module docstring);
    ``act``: the activation dtype; ``notes``: one sentence per difference."""

    chosen: Precision
    run: Precision
    act: str
    modules: tuple = ()
    notes: tuple = ()
    flagged: bool = False      # a --weight-dtype flag chose the weights (not the checkpoint's own)

    @property
    def quantized(self) -> bool:
        """Whether any weight runs quantized."""
        return any(f.quantized for _, f in self.run.weights) or any(f is not None and f.quantized
                                                                     for _, _, f in self.run.ops)

    @property
    def kv_dtype(self) -> str:
        """The KV cache as the kernels take it: the activation dtype's name, "int8" or "fp8"."""
        return self.run.kv_dtype(self.act)

    @property
    def weight_label(self) -> str:
        """The run's weights in the ``--weight-dtype`` syntax (what a point's key records): the activation dtype
        when nothing is quantized, one format name when every class a plain flag sets holds it, else
        ``module=format`` pairs of the quantized classes ("experts=mxfp4"); int4's group and zero points are the
        key's own fields."""
        q = [(m, f) for m, f in self.run.weights if f.quantized]
        if not q and not self.run.ops:
            return self.act
        have = [m for m in self.modules if m in PLAIN_FLAG]
        names = {f.name for _, f in q}
        if len(names) == 1 and [m for m, _ in q] == have and not self.run.ops:
            return q[0][1].name
        return ",".join(f"{m}={f.name}" for m, f in q)

    def describe(self) -> str:
        """One line: each module class with the format it runs in ("weights from quantization_config: ...")."""
        return self.run.describe(self.modules, self.act)

    def to_dict(self) -> dict:
        """What a result file's header records: the precision asked for and the one run, per module, and the
        notes."""
        return {"chosen": self.chosen.to_dict(self.act), "run": self.run.to_dict(self.act),
                "weights": self.describe(), "kv": self.run.describe_kv(self.act), "notes": list(self.notes)}


def kernel_format(f):
    """The format our kernels hold a weight stored in ``f``: itself when registered, GPTQ / AWQ int4 as our int4
    with zero points of its group; None when no kernel of ours runs it."""
    if f.name in FORMATS:
        return f
    if f.element == "int4" and f.zero_point:
        return weight_format("int4", f.group_size, True)
    return None


@lru_cache(maxsize=64)
def run_precision(cfg: ModelConfig, act_dtype: str, weight=None, kv=None, *, group_size=None,
                  zero_point=False) -> RunPrecision:
    """The run's precision (module docstring): ``weight`` / ``kv`` the flags (None: the checkpoint's own)."""
    w = str(weight).strip().lower() if weight not in (None, "") else ""
    if w and "=" not in w and w != act_dtype and not weight_format(w).quantized:
        raise RooflineError(f"--weight-dtype {weight}: the weights are held in the activation dtype ({act_dtype}: "
                            f"unquantized) or a quantized format ({', '.join(run_names('weight'))}): give one of "
                            "those.")
    kv = None if kv in (None, "") else str(kv).strip().lower()
    if kv is not None and kv != act_dtype and kv not in run_names("kv"):
        raise RooflineError(f"the KV cache is {act_dtype} (the activation dtype) or 8-bit "
                            f"({' or '.join(KV_DTYPES)}), but {kv!r} was given.")
    chosen = precision_of(cfg).with_flags(weight, None if kv == act_dtype else kv, group_size=group_size,
                                          zero_point=zero_point)
    if kv == act_dtype:                                  # --kv-dtype <the activation dtype>: a float cache
        chosen = replace(chosen, kv=None, source=chosen.source or "--kv-dtype")
    kinds: dict = {}
    for o in model_ops(cfg):
        if any(w.role in WEIGHT_ROLES for w in o.weights):
            kinds.setdefault(o.module, set()).add(o.kind)
    weights, acts, notes = {}, {}, []
    for m, f in chosen.weights:
        if m not in kinds:                               # a class a plain flag sets that this model has not
            continue
        run = _module_format(m, f, kinds.get(m, set()), act_dtype, notes)
        if run is None:
            continue
        weights[m] = run
        a = FORMATS[run.name].acts.get("experts" if m == "experts" else "linear")
        if a is not None:
            acts[m] = a
        _say_acts(m, dict(chosen.acts).get(m), a, act_dtype, notes)
    ops = []
    for name, m, f in chosen.ops:
        run = None if f is None else _module_format(f"{m} ({name})", f, kinds.get(m, set()), act_dtype, notes)
        if run != dict(weights).get(m):
            ops.append((name, m, run))
    kvf = _kv(chosen.kv, act_dtype, notes)
    run = Precision(module_pairs(weights), module_pairs(acts), tuple(ops), kvf, chosen.source)
    return RunPrecision(chosen, run, act_dtype, module_classes(cfg), tuple(dict.fromkeys(notes)),
                        weight not in (None, ""))


def check_run(rp: RunPrecision, cfg: ModelConfig, backend: str, device, kv_flag=None) -> str:
    """The run's KV dtype ("int8" / "fp8" / the activation dtype's name) once ``device`` and ``backend`` can run
    ``rp``: an fp8 cache on a device without fp8, or routed experts in a format the fused MoE kernel lacks on the
    triton backend, refused in one line saying what to give."""
    check_runnable(cfg)         # ops with formulas and no kernels yet (Gated DeltaNet)
    kvdt = rp.kv_dtype
    if kvdt == "fp8" and kv_flag in (None, "") and not fp8_supported(device):
        raise RooflineError(f"{cfg.name}: the checkpoint's KV cache is {rp.chosen.kv.describe()}, and "
                            f"{device_label(device)} has no fp8: give --kv-dtype int8 or {rp.act} to run it here.")
    if kvdt in KV_DTYPES:
        check_kv_dtype(kvdt, device)
    check_model_kv(cfg, kvdt)
    f = dict(rp.run.weights).get("experts")
    if backend == "triton" and f is not None and f.name not in QUANT_CODES:
        raise RooflineError(f"{cfg.name}: the fused MoE kernel takes experts in {', '.join(QUANT_CODES)}, not "
                            f"{f.describe()}: give --backend torch, or --weight-dtype experts=<one of those>.")
    return kvdt


def _module_format(m: str, f, kinds: set, act_dtype: str, notes: list):
    if not f.quantized:
        return None                                      # held in the activation dtype
    if not kinds <= set(QUANTIZED_KINDS):
        notes.append(f"{m}: {f.describe()} in the checkpoint, run in {act_dtype} (our kernels take its "
                     f"{'/'.join(sorted(kinds - set(QUANTIZED_KINDS)))} weights as floats)")
        return None
    run = kernel_format(f)
    if run is None:
        raise RooflineError(f"{m}: no kernel of ours runs {f.describe()} weights (ours: {', '.join(FORMATS)}): give "
                            f"--weight-dtype {m.split(' ')[0]}=<one of those> to time the module in another format.")
    if run != f:
        notes.append(f"{m}: {f.describe()} in the checkpoint, run as {run.describe()} (our kernels' layout of the "
                     "same values)")
    return run


def _say_acts(m: str, asked, run, act_dtype: str, notes: list) -> None:
    if asked is None and run is not None:         # weight-only asked (a flag), W8A8 run: our fp8 GEMM's way
        notes.append(f"{m}: our kernel for its weights quantizes the activations too: run as {run.describe()}")
        return
    if asked is None or (run is not None and run.name == asked.name):
        return
    notes.append(f"{m}: the checkpoint's activations are {asked.describe()}; our kernels run them "
                 + (f"as {run.describe()}" if run is not None else f"in {act_dtype} (weight-only: the weights are "
                                                                    "dequantized in registers)"))


def _kv(f, act_dtype: str, notes: list):
    if f is None or not f.quantized:
        return None
    ours = KV_RUN.get(f.element)
    if ours is None:
        raise RooflineError(f"the KV cache is {f.describe()}: our kernels run 8-bit caches of int8 or fp8 e4m3 only: "
                            f"give --kv-dtype fp8, int8 or {act_dtype}.")
    run = kv_format(ours)
    if run != f:
        notes.append(f"KV cache: {f.describe()} in the checkpoint, run as {run.describe()}")
    return run


def check_tp(rp: RunPrecision, cfg: ModelConfig, tp: int) -> None:
    """One line when a rank's shard under ``--tp tp`` would cut a scale group or block of a format the run holds
    (``kernels.quant.check_tp_scales``, format by format)."""
    for f in dict.fromkeys(f for _, f in rp.run.weights if f.quantized):
        check_tp_scales(cfg, tp, f)
