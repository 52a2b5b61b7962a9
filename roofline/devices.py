"""Devices and their ceilings: a datasheet catalogue, custom devices, the CPU.

Every peak is *dense* (never the 2:4-sparse figure vendors print beside it) and every
device names where its figures come from. ``find_device`` accepts a catalogue key, a listed
alias or a name NVML reports (``NVIDIA H100 80GB HBM3``), compared without case, spaces,
dashes or underscores and without "NVIDIA"/"AMD"/"Tesla" (``h100``, ``H100-SXM``,
``nvidia_h100_sxm``); nothing else. A name that is not listed is an error with "did you
mean" (``h1000`` is not an H100, ``gh200`` not an H200, ``a100-pcie-40gb`` not the 80 GB SXM
card): a roofline judged against the wrong card is worse than none. Measured ceilings replace
datasheet ones through ``Device.with_ceilings``; the record keeps which is which.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from .dtypes import normalize_dtype
from .errors import RooflineError, check_positive_int, did_you_mean
from .precision.formats import native_computes
from .interconnect import (INFINITY_FABRIC_MI300X, NCCL_TUNING, NVLINK3, NVLINK4, NVLINK5, NVLINK_BRIDGE_H100_NVL,
                           PCIE4, PCIE5, Interconnect)
from .config_fields import read_json_file, show_value

T = 1e12  # TFLOP/s and TB/s to base units
GB = 1e9
MB = 1e6
MiB = 2**20

# The rates a device lists: the plain float rates (fp32 is the non-tensor one), then every low-precision
# tensor-core rate the precision registry's formats compute at (fp8, fp4: ``native_computes``), then int8.
COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", *native_computes(), "int8")


def compute_dtype(name) -> str:
    """A peak's dtype key: ``normalize_dtype``'s spellings ("bfloat16", "torch.float16", int4 -> its own key), plus
    the registry's low-precision rates it does not store ("fp4"); anything else in one line naming the choices."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key in COMPUTE_DTYPES:
        return key
    try:
        return normalize_dtype(name)
    except RooflineError:
        raise RooflineError(f"Unknown dtype {name!r}: choose one of {', '.join(COMPUTE_DTYPES)} "
                            "(int4 is priced at the int8 rate).") from None


@dataclass(frozen=True)
class CacheLevel:
    """One cache level as a ceiling: its name ("L2", "L3"), the bytes it holds (all the instances the
    measuring threads use together), the bandwidth it served in a copy/read over a working set sized to
    fit it (B/s), and where those come from. A point whose working set fits it and that moves more
    bytes/s than the DRAM roof is judged against it (``roofline.bounds.roof_for``)."""

    name: str
    size_bytes: float
    bandwidth: float
    source: str = "measured"

    def to_dict(self) -> dict:
        return {"name": self.name, "size_bytes": self.size_bytes, "bandwidth": self.bandwidth, "source": self.source}

    @classmethod
    def from_dict(cls, d, where: str) -> "CacheLevel":
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"].strip():
            raise RooflineError(f"{where} must be an object with a non-empty 'name', 'size_bytes' and 'bandwidth' "
                                f"(e.g. {{\"name\": \"L3\", \"size_bytes\": 33554432, \"bandwidth\": 8e10}}), "
                                f"but {show_value(d)} was given.")
        where = f"{where} ({d['name']})"
        return cls(d["name"], _positive_finite(d.get("size_bytes"), f"{where}: size_bytes must be a positive number "
                                                                   "of bytes"),
                   _positive_finite(d.get("bandwidth"), f"{where}: bandwidth must be a positive number of byte/s"),
                   str(d.get("source", "custom")))


@dataclass(frozen=True)
class Device:
    """A processor's ceilings in SI base units (FLOP/s, byte/s, bytes).

    ``peak_flops`` maps a compute dtype to dense FLOP/s ("fp32" is the non-tensor rate).
    ``source`` is "datasheet", "measured", "custom" or "nvml-derived"; ``provenance``
    says where the numbers come from in words. ``link`` is the interconnect to its peers
    (``roofline.interconnect``: bandwidth per direction and latency), None when unknown.
    """

    key: str
    name: str
    kind: str  # "gpu" or "cpu"
    peak_flops: dict = field(default_factory=dict)
    bandwidth: float = 0.0
    memory_bytes: float = 0.0
    l2_bytes: float = 0.0
    sms: int = 0
    source: str = "datasheet"
    provenance: str = ""
    notes: str = ""
    aliases: tuple = ()
    nvml_names: tuple = ()
    link: Interconnect | None = None
    cache_levels: tuple = ()  # CacheLevel, smallest first: per-level ceilings (a CPU's L2 and L3, a GPU's L2)

    def peak(self, dtype: str) -> float:
        d = compute_dtype(dtype)
        if d in ("int4",):
            d = "int8"
        if d not in self.peak_flops:
            have = ", ".join(self.peak_flops) or "none yet"
            hint = ("run `roofline ceilings` to measure them" if self.kind == "cpu"
                    else "pick a dtype it has or give --peak-tflops")
            raise RooflineError(f"{self.name} has no {d} peak (it has: {have}); {hint}.")
        return self.peak_flops[d]

    def ridge(self, dtype: str) -> float:
        """Ridge point in FLOP/byte: peak FLOP/s / memory bandwidth."""
        if self.bandwidth <= 0:
            raise RooflineError(f"{self.name} has no memory bandwidth; run `roofline ceilings` or give --bandwidth-gbs.")
        return self.peak(dtype) / self.bandwidth

    def with_ceilings(self, peak_flops: dict | None = None, bandwidth: float | None = None,
                      source: str = "measured", provenance: str = "") -> "Device":
        """A copy whose ceilings are replaced (e.g. by measured ones)."""
        peaks = dict(self.peak_flops)
        peaks.update({compute_dtype(k): float(v) for k, v in (peak_flops or {}).items()})
        return replace(self, peak_flops=peaks,
                       bandwidth=self.bandwidth if bandwidth is None else float(bandwidth),
                       source=source, provenance=provenance or self.provenance)

    def to_dict(self) -> dict:
        return {
            "key": self.key, "name": self.name, "kind": self.kind,
            "peak_flops": dict(self.peak_flops), "bandwidth": self.bandwidth,
            "memory_bytes": self.memory_bytes, "l2_bytes": self.l2_bytes, "sms": self.sms,
            "source": self.source, "provenance": self.provenance, "notes": self.notes,
            "link": self.link.to_dict() if self.link else None,
            **({"cache_levels": [c.to_dict() for c in self.cache_levels]} if self.cache_levels else {}),
        }

    def with_cache_levels(self, levels) -> "Device":
        """A copy with these per-level ceilings (``CacheLevel``s, or (name, size_bytes, bandwidth) tuples),
        kept smallest first."""
        levels = [c if isinstance(c, CacheLevel) else CacheLevel(*c) for c in levels]
        return replace(self, cache_levels=tuple(sorted(levels, key=lambda c: c.size_bytes)))

    def with_link(self, link: Interconnect | None) -> "Device":
        """A copy whose interconnect is ``link`` (a measured one, or one given on the command line)."""
        return replace(self, link=link)

    @classmethod
    def from_dict(cls, d: dict, *, where: str | None = None) -> "Device":
        """The inverse of ``to_dict`` (result-file headers); ceilings must be finite and not negative.

        ``where`` names the input in error messages (default: "device description NAME").
        """
        if not isinstance(d, dict):
            raise RooflineError(f"{where or 'device description'} must be a JSON object with at least 'name', "
                                f"but {show_value(d)} was given.")
        if "name" not in d:
            raise RooflineError(f"{where or 'device description'} is missing the key 'name'.")
        name = d["name"]
        if not isinstance(name, str) or not name.strip():
            raise RooflineError(f"{where or 'device description'}: name must be a non-empty string, "
                                f"but {show_value(name)} was given.")
        where = where or f"device description {name!r}"
        peaks = _peak_map(d.get("peak_flops", {}), where, "peak_flops", "a finite number of FLOP/s, zero or more",
                          scale=1.0, allow_zero=True)
        sizes = {k: _positive_finite(d.get(k, 0.0), f"{where}: {k} must be {rule}", allow_zero=True)
                 for k, rule in (("bandwidth", "a finite number of byte/s, zero or more"),
                                 ("memory_bytes", "a finite number of bytes, zero or more"),
                                 ("l2_bytes", "a finite number of bytes, zero or more"))}
        sms = check_positive_int(f"{where}: sms", d.get("sms", 0), allow_zero=True)
        link = d.get("link")
        link = Interconnect.from_dict(link, f"{where}: link") if link is not None else None
        levels = d.get("cache_levels") or []
        if not isinstance(levels, list):
            raise RooflineError(f"{where}: cache_levels must be a list of {{name, size_bytes, bandwidth}} objects, "
                                f"but {show_value(levels)} was given.")
        levels = [CacheLevel.from_dict(c, f"{where}: cache_levels[{i}]") for i, c in enumerate(levels)]
        dev = cls(key=str(d.get("key") or _norm(name)), name=name, kind=str(d.get("kind", "gpu")),
                  peak_flops=peaks, sms=sms, source=str(d.get("source", "custom")),
                  provenance=str(d.get("provenance", "")), notes=str(d.get("notes", "")), link=link, **sizes)
        return dev.with_cache_levels(levels) if levels else dev


# what a device's figures may be: beyond these no chip exists and the ridge, times and shares lose their digits
# (1e300 TFLOP/s x 1e12 overflows to inf, and the ridge inf / inf is nan)
PEAK_TFLOPS_RANGE = (1e-6, 1e9)
BANDWIDTH_GBS_RANGE = (1e-6, 1e9)


def within(value: float, bounds: tuple, name: str, unit: str, shown: str | None = None) -> float:
    """``value`` if inside ``bounds`` (lo, hi), else a one-line RooflineError naming ``name`` and the range."""
    lo, hi = bounds
    if not lo <= value <= hi:
        raise RooflineError(f"{name} must be between {lo:g} and {hi:g}{' ' + unit if unit else ''}, but "
                            f"{shown if shown is not None else show_value(value)} was given.")
    return value


def _positive_finite(value, rule: str, shown: str | None = None, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float above zero (or zero, with ``allow_zero``); else RooflineError.

    The message is ``f"{rule}, but {shown} was given."``: ``rule`` names the input and the allowed form,
    ``shown`` the bad value (default: as JSON writes it).
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        try:
            v = float(value)
        except OverflowError:
            v = math.inf
        ok = math.isfinite(v) and (v > 0 or (allow_zero and v == 0))
    if not ok:
        raise RooflineError(f"{rule}, but {shown if shown is not None else show_value(value)} was given.")
    return v


def _peak_map(peaks, where: str, key: str, form: str, *, scale: float, allow_zero: bool = False,
              bounds: tuple | None = None) -> dict:
    """{dtype: peak} checked (known dtypes, finite numbers above zero, inside ``bounds`` before scaling, when
    given) and multiplied by ``scale``.

    ``form`` is the allowed value in words, e.g. 'a positive number of TFLOP/s, e.g. {"bf16": 989}'.
    """
    rule = f"{where}: {key} must map a dtype to {form}"
    if not isinstance(peaks, dict):
        raise RooflineError(f"{rule}, but {show_value(peaks)} was given.")
    out, seen = {}, {}
    for k, v in peaks.items():
        try:
            dt = compute_dtype(k)
        except RooflineError as e:
            raise RooflineError(f"{where}: {key} names an unknown dtype: {e}") from None
        if dt in out:
            raise RooflineError(f"{where}: {key} gives {dt} twice ({seen[dt]!r} and {k!r}): keep one.")
        shown = (json.dumps(k) if isinstance(k, str) else repr(k)) + f": {show_value(v)}"
        v = _positive_finite(v, rule, shown, allow_zero=allow_zero)
        if bounds is not None:
            within(v, bounds, f"{where}: {key} {dt}", "", shown)
        out[dt], seen[dt] = v * scale, k
    return out


_NV = "NVIDIA datasheet (dense = half the 2:4-sparse figure), as tabulated in stas00/ml-engineering compute/accelerator and torchtitan's peak table"


def _gpu(key, name, tflops: dict, *, bw_tbs, mem_gb, l2_mb, sms, provenance=_NV, notes="", aliases=(), nvml=(),
         link=None):
    """A datasheet entry: dense TFLOP/s per dtype (a dtype the card lacks is left out), TB/s, GB, MB."""
    peaks = {k: v * T for k, v in tflops.items()}
    return Device(key=key, name=name, kind="gpu", peak_flops=peaks, bandwidth=bw_tbs * T,
                  memory_bytes=mem_gb * GB, l2_bytes=l2_mb * MB, sms=sms, source="datasheet",
                  provenance=provenance, notes=notes, aliases=tuple(aliases), nvml_names=tuple(nvml), link=link)


def _link(name: str, per_dir_gbs: float, hop_us: float, provenance: str, notes: str = "") -> Interconnect:
    """A link the interconnect module does not list, with its latency from NCCL's tuning model."""
    return Interconnect(name, per_dir_gbs * GB, 6.6e-6, hop_us * 1e-6, "datasheet",
                        f"{provenance}; latency: {NCCL_TUNING.format(hop=hop_us)}", notes)


NVLINK2_V100 = _link("NVLink 2 (6 links)", 150, 0.6, "NVIDIA V100 datasheet: 300 GB/s NVLink per GPU, both directions")
NVLINK4_H800 = _link("NVLink 4 (8 links)", 200, 0.6, "NVIDIA H800 SXM5 (export variant): 400 GB/s NVLink per GPU, "
                     "both directions")
PCIE3 = _link("PCIe 3.0 x16", 16, 1.0, "PCI-SIG PCIe 3.0: 8 GT/s x 16 lanes, about 16 GB/s per direction",
              "no NVLink: peers talk over PCIe (through the host bridge or a switch)")
INFINITY_FABRIC_MI355X = _link("Infinity Fabric (7 links)", 537.6, 0.6, "AMD Instinct MI355X product page: 153.6 GB/s "
                               "peak per Infinity Fabric link, 7 links = 1,075.2 GB/s both directions (unverified)")
INFINITY_FABRIC_MI250X = _link("Infinity Fabric (8 links)", 400, 0.6, "AMD Instinct MI250X datasheet: 800 GB/s peak "
                               "Infinity Fabric bandwidth per module, both directions (unverified per GCD)")

CATALOGUE: dict[str, Device] = {d.key: d for d in [
    _gpu("h100-sxm", "NVIDIA H100 SXM5 80GB", dict(fp32=67, tf32=494.5, fp16=989, bf16=989, fp8=1979, int8=1979),
         bw_tbs=3.35, mem_gb=80, l2_mb=50, sms=132,
         notes="bf16 989 TF is at 1830 MHz; PyTorch inductor's 1979 is the sparse figure.",
         aliases=("h100", "h100-sxm5", "h100-80gb"), nvml=("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
         link=NVLINK4),
    _gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", dict(fp32=51, tf32=378, fp16=756, bf16=756, fp8=1513, int8=1513),
         bw_tbs=2.0, mem_gb=80, l2_mb=50, sms=114, nvml=("NVIDIA H100 PCIe",), link=PCIE5),
    _gpu("h100-nvl", "NVIDIA H100 NVL 94GB", dict(fp32=60, tf32=417.5, fp16=835.5, bf16=835.5, fp8=1670.5),
         bw_tbs=3.9, mem_gb=94, l2_mb=50, sms=132, nvml=("NVIDIA H100 NVL",), link=NVLINK_BRIDGE_H100_NVL),
    _gpu("h200", "NVIDIA H200 SXM 141GB", dict(fp32=67, tf32=494.5, fp16=989, bf16=989, fp8=1979, int8=1979),
         bw_tbs=4.8, mem_gb=141, l2_mb=50, sms=132, aliases=("h200-sxm",), nvml=("NVIDIA H200",), link=NVLINK4),
    _gpu("a100-sxm-40gb", "NVIDIA A100 SXM 40GB", dict(fp32=19.5, tf32=156, fp16=312, bf16=312, int8=624),
         bw_tbs=1.555, mem_gb=40, l2_mb=40, sms=108, aliases=("a100-40gb",),
         nvml=("NVIDIA A100-SXM4-40GB",), link=NVLINK3),
    _gpu("a100-sxm-80gb", "NVIDIA A100 SXM 80GB", dict(fp32=19.5, tf32=156, fp16=312, bf16=312, int8=624),
         bw_tbs=2.039, mem_gb=80, l2_mb=40, sms=108, aliases=("a100", "a100-80gb", "a100-sxm"),
         # "A100-PG509-200" (the SXM4 board's part number) is what some drivers report for an A100
         # SXM: facebookincubator/AITemplate PR #749; traces tell 40 from 80 GB by totalGlobalMem
         nvml=("NVIDIA A100-SXM4-80GB", "NVIDIA A100-PG509-200"), link=NVLINK3),
    _gpu("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", dict(fp32=19.5, tf32=156, fp16=312, bf16=312, int8=624),
         bw_tbs=1.935, mem_gb=80, l2_mb=40, sms=108, aliases=("a100-pcie", "a100-pcie-80gb"),
         nvml=("NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"), link=PCIE4),
    _gpu("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", dict(fp32=19.5, tf32=156, fp16=312, bf16=312, int8=624),
         bw_tbs=1.555, mem_gb=40, l2_mb=40, sms=108, provenance="NVIDIA A100 datasheet (PCIe 40GB: 1,555 GB/s; dense)",
         nvml=("NVIDIA A100-PCIE-40GB",), link=PCIE4),
    _gpu("h800", "NVIDIA H800 SXM5 80GB", dict(fp32=67, tf32=494.5, fp16=989, bf16=989, fp8=1979, int8=1979),
         bw_tbs=3.35, mem_gb=80, l2_mb=50, sms=132,
         provenance="NVIDIA H800 SXM5 product specifications (the H100 SXM5's export variant: the same SMs, "
                    "clocks and HBM3; dense)",
         notes="Compute and memory as the H100 SXM5; only NVLink is cut to 400 GB/s (both directions).",
         aliases=("h800-sxm", "h800-sxm5"), nvml=("NVIDIA H800", "NVIDIA H800 80GB HBM3"), link=NVLINK4_H800),
    _gpu("h20", "NVIDIA H20 96GB", dict(fp32=44, tf32=74, fp16=148, bf16=148, fp8=296, int8=296),
         bw_tbs=4.0, mem_gb=96, l2_mb=60, sms=78,
         provenance="NVIDIA HGX H20 product brief (dense = half the sparse figure)",
         notes="A Hopper part with most tensor throughput removed: ridge ~37 FLOP/byte in bf16 (unverified: "
               "measure with `roofline ceilings`).", nvml=("NVIDIA H20",), link=NVLINK4),
    _gpu("v100-sxm2", "NVIDIA V100 SXM2 32GB", dict(fp32=15.7, fp16=125),
         bw_tbs=0.900, mem_gb=32, l2_mb=6, sms=80,
         provenance="NVIDIA Tesla V100 datasheet (SXM2: 125 TF fp16 tensor, 15.7 TF fp32, 900 GB/s)",
         notes="Volta has no bf16, tf32 or int8 tensor cores: run it in fp16 or fp32 (--dtype fp16). The 16 GB "
               "board has the same ceilings.", aliases=("v100", "v100-sxm2-32gb", "v100-32gb"),
         nvml=("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-16GB", "Tesla V100-SXM3-32GB"), link=NVLINK2_V100),
    _gpu("v100-pcie", "NVIDIA V100 PCIe 32GB", dict(fp32=14, fp16=112),
         bw_tbs=0.900, mem_gb=32, l2_mb=6, sms=80,
         provenance="NVIDIA Tesla V100 datasheet (PCIe: 112 TF fp16 tensor, 14 TF fp32, 900 GB/s)",
         notes="Volta has no bf16, tf32 or int8 tensor cores: run it in fp16 or fp32. The 16 GB board has the "
               "same ceilings.", aliases=("v100-pcie-32gb",), nvml=("Tesla V100-PCIE-32GB", "Tesla V100-PCIE-16GB"),
         link=PCIE3),
    _gpu("t4", "NVIDIA T4", dict(fp32=8.1, fp16=65, int8=130),
         bw_tbs=0.320, mem_gb=16, l2_mb=4, sms=40,
         provenance="NVIDIA T4 datasheet (65 TF fp16 tensor, 130 TOPS int8, 8.1 TF fp32, 320 GB/s; 70 W)",
         notes="Turing has no bf16 or tf32: run it in fp16 (--dtype fp16). At 70 W it rarely holds its boost "
               "clock: measure.", aliases=("tesla-t4",), nvml=("Tesla T4",), link=PCIE3),
    _gpu("l4", "NVIDIA L4", dict(fp32=30.3, tf32=60, fp16=121, bf16=121, fp8=242.5, int8=242.5),
         bw_tbs=0.300, mem_gb=24, l2_mb=48, sms=58,
         notes="Tensor rates are halves of the datasheet's sparse figures (unverified): measure. "
               "PyTorch inductor's 3350 GB/s for L4 is wrong.", nvml=("NVIDIA L4",), link=PCIE4),
    _gpu("l40s", "NVIDIA L40S", dict(fp32=91.6, tf32=183, fp16=362, bf16=362, fp8=733, int8=733),
         bw_tbs=0.864, mem_gb=48, l2_mb=96, sms=142, nvml=("NVIDIA L40S",), link=PCIE4),
    _gpu("a10g", "NVIDIA A10G", dict(fp32=31.2, tf32=62.5, fp16=125, bf16=125, int8=250),
         bw_tbs=0.600, mem_gb=24, l2_mb=6, sms=80,
         provenance="NVIDIA A10 datasheet (dense); the A10G is AWS's variant with other clocks",
         notes="Tensor rates are the A10's and unverified for the A10G (reported lower, ~70 TF): "
               "run `roofline ceilings` and trust the measured figures.", nvml=("NVIDIA A10G",), link=PCIE4),
    _gpu("rtx-4090", "NVIDIA GeForce RTX 4090",
         dict(fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2, fp8=330.3, int8=660.6),
         bw_tbs=1.008, mem_gb=24, l2_mb=72, sms=128,
         provenance="NVIDIA Ada Lovelace architecture whitepaper (dense)",
         notes="fp16/bf16/fp8 at fp32 accumulate (the fp16-accumulate rates are 2x).",
         aliases=("4090",), nvml=("NVIDIA GeForce RTX 4090",), link=PCIE4),
    _gpu("b200", "NVIDIA B200", dict(fp32=75, tf32=1100, fp16=2250, bf16=2250, fp8=4500, fp4=9000, int8=4500),
         bw_tbs=8.0, mem_gb=180, l2_mb=126, sms=148,
         provenance="NVIDIA DGX B200 / HGX B200 datasheet (dense); fp4: NVIDIA GB200 NVL72 datasheet, table "
                    "'Individual Blackwell GPU Specifications', HGX B200 column: FP4 Tensor Core 18 PFLOPS* "
                    "(* with 2:4 sparsity) halved to 9 PFLOPS dense",
         notes="SKUs differ: fp32 75-80 TF, tf32 1100-1125 TF, 7.7-8.0 TB/s. L2 size unverified.",
         nvml=("NVIDIA B200",), link=NVLINK5),
    _gpu("gb200", "NVIDIA GB200 (one Blackwell GPU)",
         dict(fp32=80, tf32=1250, fp16=2500, bf16=2500, fp8=5000, fp4=10000, int8=5000),
         bw_tbs=8.0, mem_gb=186, l2_mb=126, sms=148,
         provenance="NVIDIA GB200 NVL72 datasheet, per GPU (the rack's figures / 72; dense = half the sparse); "
                    "fp4: its table 'Individual Blackwell GPU Specifications', GB200 column: FP4 Tensor Core "
                    "20 PFLOPS* (* with 2:4 sparsity) halved to 10 PFLOPS dense",
         notes="Per Blackwell GPU of a GB200 superchip; L2 size and SM count as B200 (unverified).",
         aliases=("gb200-nvl72",), nvml=("NVIDIA GB200",), link=NVLINK5),
    _gpu("b300", "NVIDIA B300 (Blackwell Ultra, HGX)", dict(fp32=75, tf32=1125, fp16=2250, bf16=2250, fp8=4500,
                                                           fp4=13125),
         bw_tbs=7.7, mem_gb=288, l2_mb=126, sms=148,
         provenance="NVIDIA HGX B300 platform specifications, 8 GPUs / 8: FP4 Tensor Core** 144 PFLOPS | 105 "
                    "PFLOPS (** with | without sparsity) = 13.125 PFLOPS dense per GPU (as tabulated by "
                    "glennklockwood.com/garden/processors/B300: 13,125 TF); FP8/FP6 72, FP16/BF16 36, TF32 18 "
                    "PFLOPS* (* with sparsity) halved = 4.5, 2.25, 1.125; FP32 600 TFLOPS = 75; memory up to "
                    "2.3 TB = 288 GB",
         notes="Blackwell Ultra cuts INT8 and FP64 to a trickle: no int8 peak listed. Other secondary figures for "
               "dense FP4 per B300: 14 (Verda's per-GPU table), 15 (the GB300's): measure. Verda lists 270 GB usable "
               "and 7.7 TB/s (used here, unverified); L2 and SM count as B200 (unverified).",
         aliases=("b300-sxm", "hgx-b300", "blackwell-ultra"), nvml=("NVIDIA B300 SXM6 AC", "NVIDIA B300"),
         link=NVLINK5),
    _gpu("gb300", "NVIDIA GB300 (one Blackwell Ultra GPU)",
         dict(fp32=80, tf32=1250, fp16=2500, bf16=2500, fp8=5000, fp4=15000),
         bw_tbs=8.0, mem_gb=288, l2_mb=126, sms=148,
         provenance="NVIDIA GB300 NVL72 datasheet, per GPU (the rack's figures / 72): FP4 Tensor Core 1,440 "
                    "PFLOPS* | 1,080 PFLOPS (sparse | dense) = 15 PFLOPS dense; FP8/FP6 720, FP16/BF16 360, TF32 "
                    "180 PFLOPS* (* with 2:4 sparsity) halved = 5, 2.5, 1.25; HBM3e up to 576 TB/s = 8 TB/s, "
                    "up to 288 GB per GPU",
         notes="fp32 80 TF is Verda's per-GPU table (unverified); no int8 peak listed (Blackwell Ultra cuts INT8). "
               "L2 size and SM count as B200 (unverified).",
         aliases=("gb300-nvl72",), nvml=("NVIDIA GB300",), link=NVLINK5),
    _gpu("mi300x", "AMD Instinct MI300X",
         dict(fp32=163.4, tf32=653.7, fp16=1307.4, bf16=1307.4, fp8=2614.9, int8=2614.9),
         bw_tbs=5.3, mem_gb=192, l2_mb=32, sms=304,
         provenance="AMD Instinct MI300X datasheet (dense)",
         notes="'sms' holds compute units; l2 is 4 MB per XCD (x8), plus a 256 MB Infinity Cache.",
         nvml=("AMD Instinct MI300X",), link=INFINITY_FABRIC_MI300X),
    _gpu("mi325x", "AMD Instinct MI325X",
         dict(fp32=163.4, tf32=653.7, fp16=1307.4, bf16=1307.4, fp8=2614.9, int8=2614.9),
         bw_tbs=6.0, mem_gb=256, l2_mb=32, sms=304,
         provenance="AMD Instinct MI325X datasheet (dense: FP8 2,614.9 TFLOPS, 5,229.8 with sparsity; the MI300X's "
                    "CDNA 3 compute with 256 GB HBM3E at 6 TB/s); CUs and L2 from the ROCm 'AMD GPU "
                    "specifications' table (gfx942: 304 CUs, 32 MB L2 = 4 per XCD)",
         notes="'sms' holds compute units; plus a 256 MB Infinity Cache. MI300-series fp8 is e4m3fnuz, not e4m3fn. "
               "Infinity Fabric taken as the MI300X's (unverified).",
         nvml=("AMD Instinct MI325X",), link=INFINITY_FABRIC_MI300X),
    _gpu("mi355x", "AMD Instinct MI355X",
         dict(fp32=157.3, fp16=2516.6, bf16=2516.6, fp8=5033.2, fp4=10066.3),
         bw_tbs=8.0, mem_gb=288, l2_mb=32, sms=256,
         provenance="AMD Instinct MI355X product page / CDNA 4 architecture whitepaper (dense): OCP-FP8 5.0 PFLOPS "
                    "(10.1 with sparsity), MXFP4/MXFP6 10.1 PFLOPS (20.1 with sparsity), FP16/BF16 2.5 PFLOPS, FP32 matrix 157.3 TFLOPS, "
                    "288 GB HBM3E at 8 TB/s; FP8 = 8,192 FLOP/clock/CU (ISSCC 2026) x 256 CUs x 2.4 GHz = 5,033.2 "
                    "TFLOPS; CUs and L2 from the ROCm 'AMD GPU specifications' table (gfx950: 256 CUs, 32 MB L2)",
         notes="'sms' holds compute units; plus a 256 MB Infinity Cache. fp4 is MXFP4 (e2m1, blocks of 32, e8m0). "
               "CDNA 4 has no TF32 matrix rate and no int8 peak is listed here. The air-cooled MI350X is ~8% lower "
               "(9.2 PFLOPS MXFP4, 4.6 FP8): not this entry.",
         nvml=("AMD Instinct MI355X",), link=INFINITY_FABRIC_MI355X),
    _gpu("mi250x", "AMD Instinct MI250X", dict(fp32=95.7, fp16=383, bf16=383, int8=383),
         bw_tbs=3.2, mem_gb=128, l2_mb=16, sms=220,
         provenance="AMD Instinct MI250X datasheet (dense matrix rates; fp32 is the matrix rate, vector 47.9)",
         notes="One MI250X is two GCDs, and torch sees each as its own device with half of every figure here "
               "(64 GB, 1.6 TB/s, 191.5 TF bf16): give a single GCD's run --device-file or measure it. 'sms' holds "
               "compute units; l2 is 8 MB per GCD.", aliases=("mi250",), nvml=("AMD Instinct MI250X",),
         link=INFINITY_FABRIC_MI250X),
]}


def _norm(s: str) -> str:
    s = s.lower()
    for word in ("nvidia", "geforce", "amd", "instinct", "tesla"):
        s = s.replace(word, "")
    return re.sub(r"[^a-z0-9]+", "", s)


CPU_NAMES = ("cpu", "thiscpu", "host")


def _index() -> dict[str, str]:
    """Every accepted spelling, normalized -> catalogue key: keys, names, listed aliases and NVML names."""
    idx = {}
    for d in CATALOGUE.values():
        for n in (d.key, d.name, *d.aliases, *d.nvml_names):
            idx.setdefault(_norm(n), d.key)
    return idx


def find_device(name: str) -> Device:
    """Catalogue look-up by key, name, listed alias or NVML name (case, spaces and dashes aside); nothing fuzzier.

    An unlisted name is a RooflineError with the closest listed names ("did you mean") and the choices.
    """
    if name is None or not str(name).strip():
        raise RooflineError("No device name given: " + _choices())
    key = _norm(str(name))
    if key in CPU_NAMES:
        return cpu_device()
    idx = _index()
    if key in idx:
        return CATALOGUE[idx[key]]
    raise RooflineError(f"Unknown device {name!r}{did_you_mean(key, idx)}. " + _choices())


def _choices() -> str:
    return ("Known devices (exact names or their listed aliases, see `roofline devices`): " + ", ".join(CATALOGUE)
            + ", cpu; or describe one with --device-file FILE.json or --peak-tflops/--bandwidth-gbs.")


def cpu_device(name: str = "CPU", peak_flops: dict | None = None, bandwidth: float = 0.0) -> Device:
    """This machine's CPU. Its ceilings are measured (``roofline ceilings``), never from a datasheet."""
    return Device(key="cpu", name=name, kind="cpu", peak_flops=dict(peak_flops or {}), bandwidth=bandwidth,
                  source="measured" if peak_flops else "unmeasured",
                  provenance="measured on this machine (achievable, not peak)" if peak_flops
                  else "ceilings not measured yet: run `roofline ceilings`")


def custom_device(peak_tflops: float, bandwidth_gbs: float, name: str = "custom",
                  dtype: str = "bf16") -> Device:
    """A device from two numbers: a peak for ``dtype`` in TFLOP/s and bandwidth in GB/s."""
    if peak_tflops is None or bandwidth_gbs is None:
        given = ("nothing" if peak_tflops is None and bandwidth_gbs is None else
                 f"only --bandwidth-gbs {bandwidth_gbs!r}" if peak_tflops is None else
                 f"only --peak-tflops {peak_tflops!r}")
        lacking = " and ".join(f for f, v in (("--peak-tflops", peak_tflops), ("--bandwidth-gbs", bandwidth_gbs))
                               if v is None)
        raise RooflineError(f"a custom device needs both --peak-tflops (dense TFLOP/s, e.g. 989) and --bandwidth-gbs "
                            f"(GB/s, e.g. 3350), but {given} was given: add {lacking}.")
    peak = _positive_finite(peak_tflops, "--peak-tflops must be a positive, finite number of dense TFLOP/s "
                                         "(e.g. 989)", repr(peak_tflops))
    bw = _positive_finite(bandwidth_gbs, "--bandwidth-gbs must be a positive, finite number of GB/s (e.g. 3350)",
                          repr(bandwidth_gbs))
    within(peak, PEAK_TFLOPS_RANGE, "--peak-tflops", "dense TFLOP/s (e.g. 989)", repr(peak_tflops))
    within(bw, BANDWIDTH_GBS_RANGE, "--bandwidth-gbs", "GB/s (e.g. 3350)", repr(bandwidth_gbs))
    d = compute_dtype(dtype)
    peaks = {d: peak * T}
    if d in ("bf16", "fp16"):
        peaks.setdefault("bf16", peak * T)
        peaks.setdefault("fp16", peak * T)
    return Device(key=_norm(name) or "custom", name=name, kind="gpu", peak_flops=peaks,
                  bandwidth=bw * GB, source="custom",
                  provenance=f"given on the command line: {peak_tflops} TFLOP/s {d}, {bandwidth_gbs} GB/s")


_FILE_FORM = "a JSON object with at least 'name', 'peak_tflops' {dtype: value} and 'bandwidth_gbs'"


def load_device_file(path: str | Path) -> Device:
    """A device from JSON: {"name", "peak_tflops": {"bf16": 989, ...}, "bandwidth_gbs": 3350, ...}.

    Base-unit keys ("peak_flops" in FLOP/s, "bandwidth" in byte/s) are accepted too. Every value is
    checked here: a bad one is a one-line RooflineError naming the key, the value and the allowed form.
    """
    p = Path(path)
    where = f"device file {p}"
    d = read_json_file(p, "device file")
    if not isinstance(d, dict) or "name" not in d:
        raise RooflineError(f"{where} must hold {_FILE_FORM}.")
    d = dict(d)
    for a, b in (("peak_tflops", "peak_flops"), ("bandwidth_gbs", "bandwidth")):
        if a in d and b in d:
            raise RooflineError(f"{where} gives both {a!r} and {b!r}: keep one ({a} is in "
                                f"{'TFLOP/s' if a == 'peak_tflops' else 'GB/s'}, {b} in base units).")
    if not any(k in d for k in ("peak_tflops", "peak_flops")) or not any(k in d for k in ("bandwidth_gbs", "bandwidth")):
        raise RooflineError(f"{where} needs 'peak_tflops' (e.g. {{\"bf16\": 989}}) and 'bandwidth_gbs' (e.g. 3350).")
    if "peak_tflops" in d:
        d["peak_flops"] = _peak_map(d.pop("peak_tflops"), where, "peak_tflops",
                                    'a positive number of TFLOP/s, e.g. {"bf16": 989}', scale=T,
                                    bounds=PEAK_TFLOPS_RANGE)
    else:
        d["peak_flops"] = _peak_map(d["peak_flops"], where, "peak_flops",
                                    'a positive number of FLOP/s, e.g. {"bf16": 9.89e14}', scale=1.0,
                                    bounds=tuple(b * T for b in PEAK_TFLOPS_RANGE))
    if not d["peak_flops"]:
        raise RooflineError(f"{where}: peak_tflops must map at least one dtype to its peak, e.g. {{\"bf16\": 989}}, "
                            "but {} was given.")
    if "bandwidth_gbs" in d:
        gbs = _positive_finite(d.pop("bandwidth_gbs"), f"{where}: bandwidth_gbs must be a positive number of GB/s, "
                               "e.g. 3350")
        d["bandwidth"] = within(gbs, BANDWIDTH_GBS_RANGE, f"{where}: bandwidth_gbs", "GB/s") * GB
    else:
        d["bandwidth"] = within(_positive_finite(d["bandwidth"], f"{where}: bandwidth must be a positive number of "
                                                 "byte/s, e.g. 3.35e12"),
                                tuple(b * GB for b in BANDWIDTH_GBS_RANGE), f"{where}: bandwidth", "byte/s")
    if "link_gbs" in d:   # the interconnect, per direction: {"link_gbs": 450, "link_latency_us": 15}
        bw = _positive_finite(d.pop("link_gbs"), f"{where}: link_gbs must be a positive number of GB/s per "
                              "direction, e.g. 450")
        lat = _positive_finite(d.pop("link_latency_us", 0.0), f"{where}: link_latency_us must be a number of "
                               "microseconds per collective, zero or more, e.g. 15", allow_zero=True)
        d["link"] = custom_link(bw, lat, f"from {p}").to_dict()
    d.setdefault("source", "custom")
    d.setdefault("provenance", f"from {p}")
    return Device.from_dict(d, where=where)


def custom_link(link_gbs: float, latency_us: float = 0.0, provenance: str = "given on the command line") -> Interconnect:
    """An interconnect from two numbers: GB/s per direction and microseconds of latency per collective launch."""
    bw = _positive_finite(link_gbs, "--link-gbs must be a positive, finite number of GB/s per direction (e.g. 450)",
                          repr(link_gbs))
    lat = _positive_finite(latency_us, "--link-latency-us must be a finite number of microseconds, zero or more "
                           "(e.g. 15)", repr(latency_us), allow_zero=True)
    return Interconnect("custom link", bw * GB, lat * 1e-6, 0.0, "custom",
                        f"{provenance}: {link_gbs:g} GB/s per direction, {latency_us:g} us per collective")
