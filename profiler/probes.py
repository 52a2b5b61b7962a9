"""Device probes: what the machine is and what state it is in (read-only, never a setter).

* GPU through NVML (``import pynvml``, the nvidia-ml-py package): name, compute
  capability, SM and memory clocks (current and max), memory bus width and the
  bandwidth it implies (max memory clock x bus bytes x 2, DDR), power limit and draw,
  temperature, and the clock-event ("throttle") reasons decoded. ``GpuProbe.sample()``
  is taken before and after every measured point; ``point_flags`` turns the two
  samples into ``Measurement.flags`` ("throttled:thermal", "power-capped", "sm-clock-low").
  Clocks read before and after a point see an idle GPU, so the sample also carries NVML's
  cumulative counters -- the time the driver held clocks down for power and for heat
  (``nvmlDeviceGetViolationStatus``) and the total energy -- whose differences cover the
  whole point. A GPU sample carries the host's CPU tick counters too, so a host busy with
  other work is flagged on a GPU run as on a CPU one.
* CPU: model name, cores, the torch threads in use, the last-level cache size; its
  samples hold CPU-time counters (/proc/stat, /proc/self/stat) and the load average, and
  a point during which other processes (or a hypervisor's steal) took over a quarter of
  the machine's CPU time is flagged "host-busy" (its times include waiting for a core).
* ``versions()`` and ``git_sha()`` for run headers and ``roofline env``.

No NVML (a CPU machine, a container without the driver) is not an error: ``open_probe``
returns a ``CpuProbe`` whose ``note`` says why, for the caller to print once.
Clocks, power limits and modes are never changed here.

Run ``python -m profiler.probes`` to print a snapshot.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import subprocess
from pathlib import Path

from .timing import now

MiB = 2**20
FALLBACK_LLC_BYTES = 32 * MiB
SM_CLOCK_LOW = 0.85  # a busy SM clock under this fraction of its max is flagged (unless power-capped)
THROTTLE_SHARE = 0.01   # thermal violation time over this share of a point: "throttled:thermal"
POWER_SHARE = 0.10      # power violation time over this share: "power-capped" (normal for a loaded H100)
NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL = 0, 1

# NVML clock-event reasons (nvmlClocksEventReason*): the bits that mean "held back".
CLOCK_EVENT_REASONS = {
    0x1: "idle",
    0x2: "applications-clocks-setting",
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "power-brake",
}
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80      # held back by heat or the board: "throttled:<reason>"
POWER_CAP_BIT = 0x4                            # the power limit: "power-capped", by design on a loaded GPU


def decode_reasons(mask: int) -> list:
    """0x24 -> ['sw-power-cap', 'sw-thermal']; unknown bits as hex."""
    out, rest = [], int(mask)
    for bit, name in CLOCK_EVENT_REASONS.items():
        if rest & bit:
            out.append(name)
            rest &= ~bit
    if rest:
        out.append(hex(rest))
    return out


class CpuProbe:
    """The CPU path: static facts only, samples are empty."""

    kind = "cpu"

    def __init__(self, note: str = ""):
        self.note = note

    def static(self) -> dict:
        return cpu_info()

    def sample(self) -> dict:
        """CPU time counters (machine and this process, in clock ticks) and the load average.

        Between two samples, the machine's busy ticks minus this process's own are what
        other processes (and, in a VM, the hypervisor's "steal") took from the cores.
        """
        out = {}
        try:
            out["loadavg_1m"] = os.getloadavg()[0]
        except OSError:  # pragma: no cover
            pass
        out["usable_cpus"] = _usable_cpus()
        out.update(_cpu_ticks())
        return out

    def close(self):
        pass


class GpuProbe:
    """NVML for one GPU. Build it with ``open_probe``."""

    kind = "gpu"
    note = ""

    def __init__(self, pynvml, handle):
        self.nv, self.h = pynvml, handle
        self._static = None

    def _try(self, f, *args, default=None):
        try:
            return f(self.h, *args)
        except (self.nv.NVMLError, AttributeError, TypeError):  # TypeError: an NVML without the call
            return default

    def static(self) -> dict:
        if self._static is None:
            nv = self.nv
            name = self._try(nv.nvmlDeviceGetName, default="unknown GPU")
            name = name.decode() if isinstance(name, bytes) else name
            cc = self._try(nv.nvmlDeviceGetCudaComputeCapability, default=None)
            max_mem = self._try(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_MEM)
            bus = self._try(nv.nvmlDeviceGetMemoryBusWidth)
            mem = self._try(nv.nvmlDeviceGetMemoryInfo)
            limit = self._try(nv.nvmlDeviceGetEnforcedPowerLimit)
            self._static = {
                "name": name,
                "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
                "sm_clock_max_mhz": self._try(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM),
                "mem_clock_max_mhz": max_mem,
                "memory_bus_bits": bus,
                # DDR: two transfers per clock. NB: HBM parts report a memory clock for which
                # this formula gives the datasheet figure; treat it as a cross-check, not a ceiling.
                "bandwidth_implied": (max_mem * 1e6 * bus / 8 * 2) if max_mem and bus else None,
                "memory_total_bytes": getattr(mem, "total", None),
                "power_limit_w": limit / 1000 if limit else None,
            }
        return dict(self._static)

    def sample(self) -> dict:
        """Clocks, power, temperature, clock-event reasons; NVML's cumulative violation and energy
        counters (differences between two samples cover the point); the host's CPU tick counters."""
        nv = self.nv
        get_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = self._try(get_reasons) if get_reasons else None
        power = self._try(nv.nvmlDeviceGetPowerUsage)
        out = {
            "sm_clock_mhz": self._try(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": self._try(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            "power_w": power / 1000 if power is not None else None,
            "temperature_c": self._try(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            "clock_event_mask": mask,
            "clock_events": decode_reasons(mask) if mask is not None else [],
            "t_s": now(),
        }
        energy = self._try(getattr(nv, "nvmlDeviceGetTotalEnergyConsumption", None))   # mJ since driver load
        if energy is not None:
            out["energy_mj"] = int(energy)
        for name, policy in (("power", NVML_PERF_POLICY_POWER), ("thermal", NVML_PERF_POLICY_THERMAL)):
            v = self._try(getattr(nv, "nvmlDeviceGetViolationStatus", None),
                          getattr(nv, f"NVML_PERF_POLICY_{name.upper()}", policy))
            if getattr(v, "violationTime", None) is not None:          # ns held down since driver load
                out[f"{name}_violation_ns"] = int(v.violationTime)
        out.update(CpuProbe().sample())       # host ticks: "host-busy" on a GPU run too
        return out

    def close(self):
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass


def open_probe(device="cpu"):
    """A GpuProbe for a CUDA device when NVML answers, else a CpuProbe whose ``note`` says why."""
    if not str(device).startswith("cuda"):
        return CpuProbe()
    try:
        import pynvml
    except ImportError:
        return CpuProbe("nvidia-ml-py is not installed (pip install nvidia-ml-py): no clocks or throttle "
                        "reasons will be recorded.")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return CpuProbe(f"NVML is not available ({e}): no GPU clocks or throttle reasons will be recorded.")
    try:
        handle = _nvml_handle(pynvml, device)
    except pynvml.NVMLError as e:
        pynvml.nvmlShutdown()
        return CpuProbe(f"NVML cannot find {device} ({e}): no GPU clocks will be recorded.")
    return GpuProbe(pynvml, handle)


def _nvml_handle(pynvml, device):
    """NVML's handle for a torch CUDA device (CUDA_VISIBLE_DEVICES renumbers devices).

    A CUDA_VISIBLE_DEVICES entry that is a UUID ("GPU-8932f937-...", or a prefix of one, as CUDA
    accepts) is looked up by UUID; a MIG entry ("MIG-<uuid>" or "MIG-GPU-<uuid>/<gi>/<ci>") maps to
    its parent GPU, whose clocks, power and temperature are the ones a MIG slice runs under. Else by
    the PCI bus id torch reports, else by the visible index.
    """
    index = int(str(device).partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    entry = visible[index] if index < len(visible) else ""
    if entry.upper().startswith(("GPU-", "MIG-")):
        return _handle_by_uuid(pynvml, entry)
    try:
        import torch

        p = torch.cuda.get_device_properties(index)
        bus = getattr(p, "pci_bus_id", None)
        if bus is not None:
            dom = getattr(p, "pci_domain_id", 0)
            dev = getattr(p, "pci_device_id", 0)
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0")
    except Exception:  # noqa: BLE001 - fall back to the index below
        pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if index < len(visible) and visible[index].strip().isdigit():
        index = int(visible[index])
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _handle_by_uuid(pynvml, entry: str):
    if entry.upper().startswith("MIG-GPU-"):                        # legacy MIG-GPU-<uuid>/<gi>/<ci>
        return _handle_by_uuid(pynvml, entry[4:].split("/")[0])
    if entry.upper().startswith("MIG-"):
        mig = pynvml.nvmlDeviceGetHandleByUUID(entry)
        parent = getattr(pynvml, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", None)
        return parent(mig) if parent else mig
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(entry)
    except pynvml.NVMLError:                                         # a prefix, as CUDA allows
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            if (uuid.decode() if isinstance(uuid, bytes) else uuid).startswith(entry):
                return h
        raise


OTHERS_BUSY = 0.25  # share of the machine's CPU time taken by others during a point


def _cpu_ticks() -> dict:
    """Machine-wide (all CPUs) busy / total / steal ticks from /proc/stat; this process's from /proc/self/stat."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = f[3] + (f[4] if len(f) > 4 else 0)             # idle + iowait
        total = sum(f[:8])                                    # guest time is already inside user
        stat = Path("/proc/self/stat").read_text()
        own = stat[stat.rindex(")") + 2:].split()             # fields after "(comm)"; utime, stime = 14, 15
        return {"ticks_total": total, "ticks_busy": total - idle, "ticks_steal": f[7] if len(f) > 7 else 0,
                "ticks_self": int(own[11]) + int(own[12])}
    except (OSError, ValueError, IndexError):
        return {}


def others_share(before: dict, after: dict) -> float:
    """Share of the machine's CPU time that went to other processes (and steal) between two samples."""
    try:
        total = after["ticks_total"] - before["ticks_total"]
        if total <= 0:
            return 0.0
        others = (after["ticks_busy"] - before["ticks_busy"]) - (after["ticks_self"] - before["ticks_self"])
        others += after["ticks_steal"] - before["ticks_steal"]
        return max(0.0, others / total)
    except (KeyError, TypeError):
        return 0.0


def violation_shares(before: dict, after: dict) -> dict:
    """Share of the time between two samples that NVML held the clocks down, per policy ("power", "thermal").

    Without timestamps any violation time counts as a full share (it did happen during the point).
    """
    out = {}
    dt = (after.get("t_s") or 0) - (before.get("t_s") or 0)
    for key in ("power", "thermal"):
        a, b = after.get(f"{key}_violation_ns"), before.get(f"{key}_violation_ns")
        if a is None or b is None:
            continue
        held = max(0, a - b) / 1e9
        out[key] = min(1.0, held / dt) if dt > 0 else (1.0 if held else 0.0)
    return out


def point_flags(before: dict, after: dict, static: dict) -> tuple:
    """Flags for a point from the samples taken around it.

    "throttled:<reason>": held back by heat or the board (clock-event bits, or NVML's thermal
    violation counter over ``THROTTLE_SHARE`` of the point); "power-capped": at the power limit
    (normal for a loaded H100: informational); "host-busy": other processes took the host's cores;
    "sm-clock-low": a busy SM clock under ``SM_CLOCK_LOW`` of its max that the power cap does not
    explain.
    """
    flags = []

    def add(f):
        if f not in flags:
            flags.append(f)
    for s in (before, after):
        mask = s.get("clock_event_mask") or 0
        for name in decode_reasons(mask & THROTTLE_BITS):
            add(f"throttled:{name}")
    shares = violation_shares(before, after)
    if shares.get("thermal", 0.0) > THROTTLE_SHARE and not any("thermal" in f for f in flags):
        add("throttled:thermal")
    capped = any((s.get("clock_event_mask") or 0) & POWER_CAP_BIT for s in (before, after)) \
        or shares.get("power", 0.0) > POWER_SHARE
    if capped:
        add("power-capped")
    if others_share(before, after) > OTHERS_BUSY:
        add("host-busy")  # other processes (or the hypervisor) took the cores during the timing
    top = static.get("sm_clock_max_mhz") or 0
    for s in (before, after):
        sm, mask = s.get("sm_clock_mhz"), s.get("clock_event_mask") or 0
        if top and sm and not (mask & 0x1) and sm < SM_CLOCK_LOW * top and not capped:
            add("sm-clock-low")
    return tuple(flags)


# ---- CPU facts ----

def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _parse_size(text: str) -> int | None:
    m = re.match(r"\s*([\d.]+)\s*([KMG]?)(i?B)?", text.strip(), re.I)
    if not m:
        return None
    mult = {"": 1, "K": 1024, "M": MiB, "G": 1024 * MiB}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def llc_bytes(sys_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[int, str]:
    """(size of the last-level cache in bytes, where it came from); 32 MiB if nothing says."""
    best = (0, 0)
    for idx in sorted(Path(sys_dir).glob("index*")):
        try:
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            level = int((idx / "level").read_text())
            size = _parse_size((idx / "size").read_text())
        except (OSError, ValueError):
            continue
        if size and level >= best[0]:
            best = (level, size)
    if best[1]:
        return best[1], f"{sys_dir} (L{best[0]})"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for level in ("L3", "L2"):
            m = re.search(rf"^{level} cache:\s*(.+)$", out, re.M)
            if m and _parse_size(m.group(1)):
                return _parse_size(m.group(1)), f"lscpu ({level})"
    except (OSError, subprocess.SubprocessError):
        pass
    return FALLBACK_LLC_BYTES, "fallback (32 MiB: no cache size found)"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_info() -> dict:
    import torch

    llc, src = llc_bytes()
    usable = _usable_cpus()
    return {"name": cpu_model_name(), "logical_cpus": os.cpu_count(), "usable_cpus": usable,
            "torch_threads": torch.get_num_threads(), "llc_bytes": llc, "llc_source": src,
            "machine": platform.machine()}


# ---- versions ----

def git_sha(repo_dir: str | Path | None = None) -> str:
    """The checkout's commit, "+dirty" when tracked files changed; "" outside git."""
    cwd = Path(repo_dir) if repo_dir else Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if not sha:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def installed(*packages: str) -> dict:
    """{package: its installed version, or "not installed"}, from the package metadata (never by importing it)."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def light_versions(*extra: str) -> dict:
    """python and roofline (and ``extra`` packages) without importing torch: the versions of a run that reads
    files or talks HTTP (a trace, counters, an endpoint), where torch's import alone is seconds of its budget."""
    return {"python": platform.python_version(), **installed("roofline", *extra)}


def versions() -> dict:
    """python, torch, triton, CUDA (torch's build), driver (NVML), roofline."""
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda or "none (CPU build)"}
    # NB: triton's version from its metadata, never by importing it: kernels.env must pick the
    # interpreter before triton is first imported.
    out.update(installed("triton", "roofline"))
    out["driver"] = _driver_version()
    return out


def cuda_driver_version() -> str | None:
    """The newest CUDA release the installed driver runs ("12.4"), from NVML; None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())
            return f"{v // 1000}.{v % 1000 // 10}"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver is the CPU path, not an error
        return None


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver is the CPU path, not an error
        return "none (no NVIDIA driver)"


if __name__ == "__main__":  # pragma: no cover
    import json

    p = open_probe("cuda" if __import__("torch").cuda.is_available() else "cpu")
    print(json.dumps({"versions": versions(), "static": p.static(), "sample": p.sample(), "note": p.note}, indent=1))
