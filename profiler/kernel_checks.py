"""Kernel validation before any timing, and the memory of a pass.

``validate_kernels(backends, dtype, device)`` runs ``kernels.check`` (every kernel and the
model against their references, small shapes) and refuses, with a ``RooflineError`` naming
what failed, to time anything when a check fails. A pass is remembered beside the ceilings,
keyed by the kernel sources, the software versions, the device and the dtype: the checks are
deterministic (seeded inputs), so the same code on the same box passes again. A failure is
never remembered.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from roofline.errors import RooflineError

from . import cache, probes
from .ceilings import device_name


def validate_kernels(backends, dtype, device="cpu", quant: bool = False) -> list:
    """Run kernels.check quickly for each backend; refuse (RooflineError) if any check fails.

    A pass is remembered (beside the ceilings) for the exact kernel sources, software versions,
    device and dtype: the checks are deterministic (seeded inputs), so the same code on the same
    box passes again. A failure is never cached, and any change to ``kernels/`` re-runs them.
    ``quant``: the run quantizes weights or the KV cache, so the quantized kernels are checked too.
    """
    from kernels.check import run_checks   # kernels imports torch: deferred, the CLI starts without it

    parts = ("kernels", "model") + (("quant",) if quant else ())
    results, failed = [], []
    for be in backends:
        key = _check_key(be, dtype, device)
        if quant:
            key["parts"] = list(parts)
        if _check_cached(key):
            continue
        rs = run_checks(backend=be, dtype=dtype, device=device, quick=True, parts=parts)
        results += [(be, r) for r in rs]
        bad = [r for r in rs if not r.passed]
        failed += [f"{be} {r.name} (max rel err {r.max_rel_err:.3g} > tol {r.tol:.3g}"
                   + (f": {r.detail}" if r.detail else "") + ")" for r in bad]
        if not bad:
            _check_store(key, rs)
    if failed:
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        raise RooflineError(f"kernel validation failed, so nothing was timed: {'; '.join(failed[:3])}{more}. "
                            f"Run `roofline check --dtype {dtype}` for details.")
    return results


def _check_key(backend: str, dtype: str, device: str) -> dict:
    import kernels   # kernels imports torch: deferred, the CLI starts without it

    src = hashlib.sha1()
    for f in sorted(Path(kernels.__file__).parent.glob("*.py")):
        src.update(f.name.encode() + f.read_bytes())
    return {"kernels": src.hexdigest(), "versions": probes.versions(), "device": device_name(device),
            "backend": backend, "dtype": dtype, "method": 1}


def _check_path(key: dict) -> Path:
    return cache.path("kernelcheck", key, digits=16)


def _check_cached(key: dict) -> bool:
    return cache.load(_check_path(key), key) is not None


def _check_store(key: dict, results) -> None:
    cache.store(_check_path(key), key, {"passed": [[r.name, r.max_rel_err, r.tol] for r in results]})
