"""The link between devices that tensor-parallel collectives cross: bandwidth per direction and latency.

Every figure is **per GPU and per direction** (what nccl-tests' bus bandwidth is compared
against): NVIDIA prints NVLink as the total of both directions ("900 GB/s" on H100 SXM is
450 GB/s each way) and PCIe as x16 per direction. A collective costs a latency term plus
its bytes on the wire over the link (``roofline.formulas.collective_time``):

    launches x (base_latency + ring steps x hop_latency) + collective_bytes / bandwidth

Latencies are NCCL's own tuning model (src/graph/tuning.cc, NCCL 2.2x: Ring/LL baseLat 6.6 us;
hwLat 0.6 us per step over NVLink, 1.0 us over PCI): estimates, not measurements. Measure the
link with ``roofline ceilings --collective --tp N``; the measured link replaces these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import formulas as F
from .errors import RooflineError

GB = 1e9
US = 1e-6
NCCL_TUNING = "NCCL src/graph/tuning.cc (Ring/LL: baseLat 6.6 us, hwLat {hop} us per step), an estimate"


@dataclass(frozen=True)
class Interconnect:
    """A device's link to its peers, in SI units: ``bandwidth`` bytes/s per direction, latencies in seconds."""

    name: str
    bandwidth: float              # bytes/s per direction, per device
    base_latency: float = 0.0     # seconds per collective launch
    hop_latency: float = 0.0      # seconds per ring step
    source: str = "datasheet"     # "datasheet" | "measured" | "custom"
    provenance: str = ""
    notes: str = ""

    def time(self, kind: str, message_bytes: float, ranks: int, launches: int = 1) -> float:
        """Seconds for ``launches`` collectives moving ``message_bytes`` in all (``formulas.collective_time``)."""
        return F.collective_time(kind, message_bytes, ranks, bandwidth=self.bandwidth,
                                 base_latency=self.base_latency, hop_latency=self.hop_latency, launches=launches)

    def latency(self, kind: str, ranks: int) -> float:
        """The latency term of one launch: base + ring steps x hop."""
        return self.base_latency + F.collective_steps(kind, ranks) * self.hop_latency if ranks > 1 else 0.0

    def to_dict(self) -> dict:
        return {"name": self.name, "bandwidth": self.bandwidth, "base_latency": self.base_latency,
                "hop_latency": self.hop_latency, "source": self.source, "provenance": self.provenance,
                "notes": self.notes}

    @classmethod
    def from_dict(cls, d, where: str = "interconnect") -> "Interconnect":
        if not isinstance(d, dict) or "bandwidth" not in d:
            raise RooflineError(f"{where} must be an object with at least 'bandwidth' (bytes/s per direction), "
                                f"not {d!r}.")
        vals = {}
        for k in ("bandwidth", "base_latency", "hop_latency"):
            v = d.get(k, 0.0)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            if not ok or (k == "bandwidth" and v <= 0):
                rule = "bytes/s, above zero" if k == "bandwidth" else "seconds, zero or more"
                raise RooflineError(f"{where}: {k} must be a finite number of {rule}, but {v!r} was given.")
            vals[k] = float(v)
        return cls(name=str(d.get("name") or "link"), source=str(d.get("source", "custom")),
                   provenance=str(d.get("provenance", "")), notes=str(d.get("notes", "")), **vals)


def _nvlink(gen: int, total_gbs: float, product: str, links: int) -> Interconnect:
    return Interconnect(f"NVLink {gen} ({links} links)", total_gbs / 2 * GB, 6.6 * US, 0.6 * US, "datasheet",
                        f"{product}: {total_gbs:g} GB/s NVLink per GPU, both directions together; "
                        f"latency: {NCCL_TUNING.format(hop=0.6)}")


def _pcie(gen: int, per_dir_gbs: float) -> Interconnect:
    return Interconnect(f"PCIe {gen}.0 x16", per_dir_gbs * GB, 6.6 * US, 1.0 * US, "datasheet",
                        f"PCI-SIG PCIe {gen}.0: {'16' if gen == 4 else '32'} GT/s x 16 lanes, about {per_dir_gbs:g} "
                        f"GB/s per direction; latency: {NCCL_TUNING.format(hop=1.0)}",
                        "no NVLink: peers talk over PCIe (through the host bridge or a switch)")


NVLINK3 = _nvlink(3, 600, "NVIDIA A100 datasheet", 12)
NVLINK4 = _nvlink(4, 900, "NVIDIA H100 / H200 product pages (SXM)", 18)
NVLINK5 = _nvlink(5, 1800, "NVIDIA DGX/HGX B200 datasheet", 18)
NVLINK_BRIDGE_H100_NVL = Interconnect(
    "NVLink 4 bridge (pairs)", 300 * GB, 6.6 * US, 0.6 * US, "datasheet",
    f"NVIDIA H100 NVL datasheet: 600 GB/s NVLink bridge, both directions; latency: {NCCL_TUNING.format(hop=0.6)}",
    "the bridge joins two GPUs; beyond a pair, peers talk over PCIe 5.0 (64 GB/s per direction)")
PCIE4 = _pcie(4, 32)
PCIE5 = _pcie(5, 64)
INFINITY_FABRIC_MI300X = Interconnect(
    "Infinity Fabric (7 links)", 448 * GB, 6.6 * US, 0.6 * US, "datasheet",
    "AMD Instinct MI300X datasheet: 896 GB/s peak Infinity Fabric bandwidth per GPU (7 links of 128 GB/s, "
    "both directions); latency assumed NVLink-like (unverified)",
    "a single ring uses one 64 GB/s link each way; RCCL spreads rings over the 7 links: measure it")


def link_from_measurements(rows, ranks: int, device_name: str, backend: str) -> Interconnect:
    """A measured link from ``roofline ceilings --collective`` rows (dicts with kind, bytes, time_s, busbw).

    Bandwidth: the best all-reduce bus bandwidth over the sizes (a roof is an upper bound). Latency:
    the smallest all-reduce's time, taken as one launch's whole latency (base_latency; hop 0) for
    ``ranks`` ranks, since the bytes of a 4 KiB message cost next to nothing at that bandwidth.
    """
    ar = [r for r in rows if r["kind"] == "all_reduce" and r["time_s"] > 0] or [r for r in rows if r["time_s"] > 0]
    if not ar:
        raise RooflineError("no collective was measured: nothing to derive a link from.")
    best = max(ar, key=lambda r: r["busbw"])
    small = min(ar, key=lambda r: r["bytes"])
    wire = F.collective_bytes(small["kind"], small["bytes"], ranks)
    lat = max(0.0, small["time_s"] - wire / best["busbw"])
    return Interconnect(f"{backend} over {ranks} ranks", best["busbw"], lat, 0.0, "measured",
                        f"measured on {device_name}: best {best['kind']} bus bandwidth at "
                        f"{best['bytes']:,} bytes; latency from the {small['bytes']:,}-byte {small['kind']}",
                        f"for {ranks} ranks (a latency measured at one rank count is not scaled to another)")
