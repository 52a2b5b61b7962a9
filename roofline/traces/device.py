"""The device a trace ran on, from its ``deviceProperties``, matched against the catalogue.

``trace_device(traces)`` returns ``(Device | None, text)``: the catalogue entry for the GPU the
trace names (forgiving names: ``NVIDIA A100-SXM4-80GB``, ``NVIDIA H100 80GB HBM3``,
``AMD Instinct MI300X``, ``NVIDIA A100-PG509-200``), refined by its memory size
(``totalGlobalMem``) where the catalogue has the same GPU in several memory sizes (an A100
40 GB and 80 GB share a name on some drivers). None when the trace names no GPU (a CPU trace,
or an empty name): the caller falls back to ``--device``. A name the catalogue does not know
("AMD Radeon Graphics", common on ROCm) is identified from the properties where they tell the part
(``PARTS``: arch, CU count, memory; gfx90a with 104 CUs and 64 GB is one MI250 GCD), said with how;
else None with the one line saying what to pass (the analyses that need no device still run).
"""

from __future__ import annotations

from dataclasses import replace

from ..devices import CATALOGUE, Device, find_device
from ..errors import RooflineError

MEMORY_TOLERANCE = 0.25   # a catalogue entry within 25% of the reported memory is the same SKU


def _by_memory(dev: Device, mem: float) -> Device:
    if not mem or not dev.memory_bytes or abs(dev.memory_bytes - mem) <= MEMORY_TOLERANCE * dev.memory_bytes:
        return dev
    family = dev.key.split("-")[0]
    form = "pcie" if "pcie" in dev.key else "sxm" if "sxm" in dev.key else ""
    near = [d for d in CATALOGUE.values() if d.key.split("-")[0] == family and d.memory_bytes
            and abs(d.memory_bytes - mem) <= MEMORY_TOLERANCE * d.memory_bytes]
    near.sort(key=lambda d: (form not in d.key, abs(d.memory_bytes - mem)))
    return near[0] if near else dev


# GPUs a trace may name generically ("AMD Radeon Graphics" is common on ROCm), told by the properties Kineto
# records (``numSms``: compute units on ROCm; ``totalGlobalMem``; ``gcnArchName`` where recorded, else
# ``computeMajor``.``computeMinor``, which HIP gives as 9.0 for gfx90a and gfx908, 9.4 for gfx942, 9.5 for gfx950).
# Each row: (arch, compute capability, CUs, memory GB, the part, catalogue key, CUs of that catalogue entry,
# share of its bandwidth and memory). A GCD of a CDNA 2 part runs at the MI250X's rate per CU (the same 1.7 GHz
# clock): its peaks are the entry's x CUs / 220, its bandwidth and memory half the entry's (one of two GCDs).
PARTS = (
    ("gfx90a", (9, 0), 104, 64, "AMD Instinct MI250 (one GCD; an MI210 has the same CUs, memory and rates)",
     "mi250x", 220, 0.5),
    ("gfx90a", (9, 0), 110, 64, "AMD Instinct MI250X (one GCD)", "mi250x", 220, 0.5),
    ("gfx942", (9, 4), 304, 192, "AMD Instinct MI300X", "mi300x", 304, 1.0),
    ("gfx942", (9, 4), 304, 256, "AMD Instinct MI325X", "mi325x", 304, 1.0),
    ("gfx950", (9, 5), 256, 288, "AMD Instinct MI355X", "mi355x", 256, 1.0),
)


def _arch(p: dict) -> str:
    a = str(p.get("gcnArchName") or p.get("arch") or "").strip().lower()
    return a.split(":")[0]


def infer_device(p: dict) -> tuple[Device | None, str]:
    """The catalogue part a trace's device properties identify when its name does not (``PARTS``), and how."""
    cus, mem = p.get("numSms"), p.get("totalGlobalMem")
    if not isinstance(cus, int) or not isinstance(mem, (int, float)) or mem <= 0:
        return None, ""
    arch, cc = _arch(p), (p.get("computeMajor"), p.get("computeMinor"))
    for part_arch, part_cc, part_cus, gb, name, key, entry_cus, share in PARTS:
        if cus != part_cus or abs(mem / 1e9 - gb) > MEMORY_TOLERANCE * gb:
            continue
        if arch and arch != part_arch or not arch and cc != part_cc:
            continue
        base = CATALOGUE[key]
        scale = part_cus / entry_cus
        dev = base if scale == 1 and share == 1 else replace(base, key=f"{key}-inferred", name=name, peak_flops={k: v * scale for k, v in
                                                                          base.peak_flops.items()},
                      bandwidth=base.bandwidth * share, memory_bytes=base.memory_bytes * share,
                      l2_bytes=base.l2_bytes * share, sms=part_cus, source="datasheet",
                      provenance=f"{base.name} datasheet x {part_cus}/{entry_cus} CUs (peaks), x {share:g} "
                                 f"(bandwidth, memory): {base.provenance}")
        told = f"arch {arch}" if arch else f"compute capability {cc[0]}.{cc[1]}"
        how = (f"inferred from the trace's device properties ({told}, {cus} CUs, {mem / 1e9:.0f} GB) -> {name}"
               + (f": the {base.name} entry's figures x {part_cus}/{entry_cus} CUs, x {share:g} its bandwidth"
                  if dev.peak_flops != base.peak_flops else "") + "; pass --device to say otherwise")
        return dev, how
    return None, ""


def unknown_device(name: str) -> str:
    """What to pass when the catalogue does not know the GPU a trace names: the roofline part's one line."""
    return (f"the trace ran on {name!r}, which the device catalogue does not know and its properties do not "
            "identify: pass --device (a catalogue name, e.g. mi300x, h100) or --device-file (your own peaks and "
            "bandwidth), or --ceilings with a results file `roofline profile` measured on that GPU, to put its ops "
            "on the roofline.")


def trace_device(traces) -> tuple[Device | None, str]:
    """The catalogue device the traces' ``deviceProperties`` name (or, for a name the catalogue does not know,
    identify: ``infer_device``), and how it was found. (None, why) when the trace names no GPU or one nothing
    identifies: the analyses that need no device still run (``profiler.trace_run``)."""
    props = [p for t in traces for p in t.devices]
    names = [str(p.get("name") or "").strip() for p in props]
    named = [(n, p) for n, p in zip(names, props) if n]
    if not named:
        return None, ("the trace names no GPU (deviceProperties is empty)" if props or any(t.is_gpu for t in traces)
                      else "a CPU trace (no GPU activity, no deviceProperties)")
    distinct = sorted({n for n, _ in named})
    name, p = named[0]
    try:
        dev = find_device(name)
    except RooflineError:
        dev, how = infer_device(p)
        if dev is None:
            return None, unknown_device(name)
        return dev, f"deviceProperties name {name!r} is not in the catalogue; " + how
    mem = p.get("totalGlobalMem")
    dev2 = _by_memory(dev, float(mem) if isinstance(mem, (int, float)) else 0.0)
    how = f"deviceProperties name {name!r} -> {dev2.name}"
    if dev2 is not dev:
        how += f" (by its {mem / 1e9:.0f} GB of memory)"
    if len(distinct) > 1:
        how += f"; the trace also names {', '.join(distinct[1:])}: classified against the first"
    return dev2, how
