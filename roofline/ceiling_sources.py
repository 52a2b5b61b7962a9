"""The ceilings a run is judged by, each with its source: the header's device (measured where measured, a
datasheet figure kept for a dtype it did not measure), its cache levels, and the catalogue's datasheet beside
them. ``roofline.analysis`` re-exports these; tables, figures and the report read them from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import units as U


@dataclass(frozen=True)
class Ceiling:
    kind: str        # "bandwidth" | "peak"
    dtype: str       # compute dtype of a peak; "" for bandwidth
    value: float     # B/s or FLOP/s
    source: str      # "measured", "datasheet", "custom", ...
    device: str      # device name
    level: str = ""  # a cache level's bandwidth ("L2", "L3"); "" for DRAM/HBM
    size_bytes: float = 0.0  # that level's size

    @property
    def unit(self) -> str:
        return "B/s" if self.kind == "bandwidth" else "FLOP/s"

    @property
    def text(self) -> str:
        """'3 TB/s measured', '800 TFLOP/s bf16 datasheet' or '90 GB/s L3 measured'."""
        what = U.si(self.value, self.unit)
        return f"{what} {self.dtype + ' ' if self.dtype else ''}{self.level + ' ' if self.level else ''}{self.source}"


def cache_ceilings(header) -> list[Ceiling]:
    """The device's cache levels as bandwidth ceilings (smallest level first); [] when it has none."""
    dev = header.device
    return [Ceiling("bandwidth", "", c.bandwidth, c.source, dev.name, c.name, c.size_bytes) for c in dev.cache_levels]


def ceiling_source(header, kind: str, dtype: str = "") -> str:
    """Where the classifying ceiling came from: a value equal to the datasheet's is 'datasheet'."""
    dev, ds = header.device, header.datasheet
    value = dev.bandwidth if kind == "bandwidth" else dev.peak_flops.get(dtype)
    if ds is not None:
        ref = ds.bandwidth if kind == "bandwidth" else ds.peak_flops.get(dtype)
        if ref is not None and value is not None and math.isclose(ref, value, rel_tol=1e-9):
            return "datasheet"
    return dev.source


def ceilings(header, dtypes=None) -> tuple[list[Ceiling], list[Ceiling]]:
    """(ceilings used for classification, datasheet ceilings) for ``dtypes`` (default: all).

    The first list is the header's device with each figure's own source (a measured run
    may carry datasheet figures for dtypes it did not measure). The second is empty when
    the device is not in the catalogue.
    """
    dev, ds = header.device, header.datasheet
    want = list(dtypes) if dtypes else list(dev.peak_flops)
    used = [Ceiling("bandwidth", "", dev.bandwidth, ceiling_source(header, "bandwidth"), dev.name)]
    used += [Ceiling("peak", d, dev.peak_flops[d], ceiling_source(header, "peak", d), dev.name)
             for d in want if d in dev.peak_flops]
    sheet = []
    if ds is not None:
        sheet = [Ceiling("bandwidth", "", ds.bandwidth, "datasheet", ds.name)]
        sheet += [Ceiling("peak", d, ds.peak_flops[d], "datasheet", ds.name) for d in want if d in ds.peak_flops]
    return used, sheet
