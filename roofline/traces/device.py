"""The device a trace ran on, from its ``deviceProperties``, matched against the catalogue.

``trace_device(traces)`` returns ``(Device | None, text)``: the catalogue entry for the GPU the
trace names (forgiving names: ``NVIDIA A100-SXM4-80GB``, ``NVIDIA H100 80GB HBM3``,
``AMD Instinct MI300X``, ``NVIDIA A100-PG509-200``), refined by its memory size
(``totalGlobalMem``) where the catalogue has the same GPU in several memory sizes (an A100
40 GB and 80 GB share a name on some drivers). None when the trace names no GPU (a CPU trace,
or an empty name): the caller falls back to ``--device``. An unknown name is a
``RooflineError`` that says to pass ``--device`` or ``--device-file``.
"""

from __future__ import annotations

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


def trace_device(traces) -> tuple[Device | None, str]:
    """The catalogue device the traces' ``deviceProperties`` name, and how it was found."""
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
        raise RooflineError(f"the trace ran on {name!r}, which the device catalogue does not know: pass --device "
                            "(a catalogue name) or --device-file (your own peaks and bandwidth), or --ceilings "
                            "with a results file `roofline profile` measured on that GPU.") from None
    mem = p.get("totalGlobalMem")
    dev2 = _by_memory(dev, float(mem) if isinstance(mem, (int, float)) else 0.0)
    how = f"deviceProperties name {name!r} -> {dev2.name}"
    if dev2 is not dev:
        how += f" (by its {mem / 1e9:.0f} GB of memory)"
    if len(distinct) > 1:
        how += f"; the trace also names {', '.join(distinct[1:])}: classified against the first"
    return dev2, how
