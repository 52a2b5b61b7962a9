"""Compile every kernel variant the launchers choose for sm_80 / sm_90, with no GPU (``roofline check --compile``).

    python -m kernels.compile_check --quick --json         # what `roofline check --compile` runs
    python -m kernels.compile_check --target sm_90 --kernel _prefill_attn_kernel

Variants come from ``kernels.variants`` (the real launchers on meta tensors with a fake SM
count). Each is compiled with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))``,
which never loads a driver: Triton's frontend, LLVM and the ``ptxas`` shipped in the triton
wheel. Per variant: the compiler's error or its resources -- shared memory (``metadata.shared``)
against the per-block limit Triton enforces at load, registers per thread (``cuobjdump
-res-usage`` on the cubin) against the 64K register file, spills (``ptxas -v``), the grids of
every launch against CUDA's limits, and blocks per SM. Failures: a compile error, shared memory
or registers over the limit, a grid over its limit, a kernel no launcher reaches. Spills are
warnings. Results are cached (triton version, ptxas version, kernel source hash, signature,
constexprs, options, target) in ``$ROOFLINE_CACHE_DIR/compile-check.json``.

The variants need Triton's compiler objects, not the interpreter's: ``run_subprocess`` runs this
module in a child with ``TRITON_INTERPRET=0`` and reads its JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from . import env
from . import variants as V

REGS_GRANULE = 256       # registers are allocated per warp in units of 256
SMEM_RESERVED = 1024     # shared memory the driver reserves per block (sm_80 and later)
# The oldest driver that loads code of a given CUDA major release (minor-version compatibility).
DRIVER_FOR_CUDA = {11: 450, 12: 525, 13: 580}
# CPU-seconds one variant takes to compile cold, for the estimate before any has compiled (benchmarks/RESULTS.md:
# the quick set's 1,196 variants in 27 min 51 s on 2 CPUs beside the test suite, ~2.8 s; quieter boxes do better).
COLD_S_PER_VARIANT = 2.8


def _about(s: float) -> str:
    """A duration as a person reads it: 'about 40 s', 'about 12 min', 'about 1.5 h'."""
    return (f"about {s:.0f} s" if s < 90 else f"about {s / 60:.0f} min" if s < 5400 else f"about {s / 3600:.1f} h")


class CompileProgress:
    """The compile loop's progress lines (``say``: stderr in the CLI): the first says how many variants compile in
    how many processes and about how long that takes (``COLD_S_PER_VARIANT`` before any has; a run with nothing
    cached says it compiles for minutes once and reads the cache after); then every ``every`` variants, how many are
    done, the time so far and the time left at the rate so far. ``clock`` (seconds) is injectable for tests."""

    def __init__(self, total: int, cached: int, jobs: int, say, clock=time.monotonic, every: int = 10):
        self.total, self.cached, self.jobs, self.say, self.clock, self.every = total, cached, jobs, say, clock, every
        self.t0 = None

    def begin(self) -> None:
        self.t0 = self.clock()
        first = (" -- a first run compiles every variant, for minutes; later runs read the cache" if not self.cached
                 else "")
        self.say(f"compiling {self.total} variants ({self.cached} cached) in {self.jobs} process"
                 f"{'es' if self.jobs != 1 else ''}: {_about(self.total * COLD_S_PER_VARIANT / self.jobs)}{first}")

    def step(self, done: int) -> bool:
        """Say where the loop is after ``done`` variants (every ``every``, and the last); True when it said it."""
        if done % self.every and done != self.total:
            return False
        t = self.clock() - self.t0
        left = t / done * (self.total - done) if done else 0.0
        tail = f", {_about(left)} left" if done < self.total else ""
        self.say(f"  {done}/{self.total} compiled in {_about(t).removeprefix('about ')}{tail}")
        return True


def cache_file() -> Path:
    root = Path(os.environ.get("ROOFLINE_CACHE_DIR") or Path.home() / ".cache" / "roofline")
    return root / "compile-check.json"


# ---- one compilation (runs in a worker process) -------------------------------------------

def parse_ptxas_log(text: str) -> dict:
    """Registers and spill bytes from ``ptxas -v`` output (the last function reported)."""
    out = {}
    for m in re.finditer(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text):
        out.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
    for m in re.finditer(r"Used (\d+) registers", text):
        out["regs_ptxas"] = int(m.group(1))
    return out


def parse_res_usage(text: str) -> dict:
    """``cuobjdump -res-usage``: REG, STACK, SHARED, LOCAL of the (one) function."""
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", text)
    return dict(zip(("regs", "stack", "static_shared", "local"), map(int, m.groups()))) if m else {}


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def ptxas_for(capability: int) -> dict:
    """Which ptxas Triton uses for a target, and its CUDA release ("12.9")."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        tool = get_ptxas(capability)
        path, text = tool.path, tool.version
    except Exception:  # noqa: BLE001 - older triton: one ptxas for every target
        path = str(_tool("ptxas"))
        try:
            text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except OSError as e:
            return {"path": path, "release": "unknown", "error": str(e)}
    m = re.search(r"(?:release )?(\d+\.\d+)", text or "")
    return {"path": str(path), "release": m.group(1) if m else "unknown"}


def compile_task(task: dict, capability: int) -> dict:
    """Compile one variant for ``sm_<capability>``; its resources, or the compiler's error."""
    from triton import compile as tcompile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(task["module"]), task["kernel"])
    src = ASTSource(fn, dict(task["signature"]), {tuple(k): v for k, v in task["constexprs"]},
                    {tuple(k): v for k, v in task["attrs"]})
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):        # TRITON_DUMP_PTXAS_LOG prints ptxas -v here
            ck = tcompile(src, target=GPUTarget("cuda", capability, 32), options=dict(task["options"]))
    except Exception as e:  # noqa: BLE001 - the compiler's error is the result
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        return {"ok": False, "error": f"{type(e).__name__}: " + (lines[-1] if lines else "")[:300]}
    out = {"ok": True, "shared": int(getattr(ck.metadata, "shared", 0) or 0)}
    text = log.getvalue()
    if "spill" not in text and "ptx" in ck.asm:      # no log (older triton): assemble once more with -v
        text = _ptxas_v(ck.asm["ptx"], capability)
    out.update(parse_ptxas_log(text))
    out.update(_res_usage(ck.asm["cubin"]))
    out.setdefault("regs", out.get("regs_ptxas"))
    return out


def _ptxas_v(ptx: str, capability: int) -> str:
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.ptx"
        p.write_text(ptx)
        r = subprocess.run([ptxas_for(capability)["path"], "-v", f"--gpu-name={arch}", str(p), "-o", str(p) + ".o"],
                           capture_output=True, text=True, timeout=300)
        return r.stdout + r.stderr


def _res_usage(cubin: bytes) -> dict:
    tool = _tool("cuobjdump")
    if not tool.exists():
        return {}
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(cubin)
        r = subprocess.run([str(tool), "-res-usage", str(p)], capture_output=True, text=True, timeout=120)
        return parse_res_usage(r.stdout)


# ---- limits ------------------------------------------------------------------------------

def blocks_per_sm(regs: int, shared: int, warps: int, t) -> int:
    """Resident blocks per SM allowed by registers, shared memory, threads and the block cap."""
    per_warp = -(-max(1, regs) * 32 // REGS_GRANULE) * REGS_GRANULE
    by_regs = (t.regs_sm // per_warp) // warps
    by_smem = t.smem_sm // (shared + SMEM_RESERVED) if shared else t.blocks_sm
    return max(0, min(by_regs, by_smem, t.threads_sm // (32 * warps), t.blocks_sm))


def evaluate(v, res: dict, t) -> dict:
    """A report row: the variant, its resources, status ("ok" | "warn" | "FAIL") and the reasons."""
    problems, warnings = [], []
    row = dict(kernel=v.kernel, target=v.target, dtype=v.dtype, config=v.config, grid=list(v.max_grid),
               launches=len(v.launches), example=v.launches[0][1], smem_limit=t.smem_block)
    if v.error:
        problems.append(v.error)
    elif not res.get("ok"):
        problems.append(res.get("error", "compile failed"))
    elif not res.get("skipped"):
        regs, shared = int(res.get("regs") or 0), int(res["shared"])
        spills = int(res.get("spill_stores", 0)) + int(res.get("spill_loads", 0))
        threads = 32 * v.num_warps
        row.update(smem=shared, regs=regs, spill_stores=res.get("spill_stores"), spill_loads=res.get("spill_loads"),
                   blocks_per_sm=blocks_per_sm(regs, shared, v.num_warps, t))
        if shared > t.smem_block:
            problems.append(f"shared memory {shared:,} B > {t.smem_block:,} B per block on {t.name}")
        if regs * threads > t.regs_block:
            problems.append(f"{regs} registers x {threads} threads = {regs * threads:,} > {t.regs_block:,}")
        if spills:
            warnings.append(f"spills {res.get('spill_stores', 0)} B stored / {res.get('spill_loads', 0)} B loaded "
                            "per thread")
        if row["blocks_per_sm"] == 0 and not problems:
            problems.append("no block fits on an SM")
    problems += V.grid_problems(v)
    row.update(status="FAIL" if problems else "warn" if warnings else "ok", problems=problems, warnings=warnings)
    return row


# ---- the whole check (runs with TRITON_INTERPRET=0) ---------------------------------------

def _key(task: dict, capability: int, fn, tversion: str, ptxas: str) -> str:
    src = getattr(fn, "cache_key", None) or hashlib.sha256(fn.src.encode()).hexdigest()
    blob = json.dumps([tversion, ptxas, src, capability, task], sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


def _load_cache() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(cache: dict) -> None:
    p = cache_file()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cache))
        tmp.replace(p)
    except OSError:
        pass  # a read-only home: the check still runs, only slower next time


def run(targets=("sm_80", "sm_90"), quick=True, kernels=None, jobs=None, progress=None, *, dtypes=None,
        models=None, compile=True) -> dict:
    """Discover, compile (or read from the cache) and evaluate; returns the report dict.

    ``kernels``, ``dtypes``, ``models``: only these (None: all). ``compile=False``: discovery and the
    grid and reach checks only (no resources).
    """
    if env.INTERPRET:
        raise RuntimeError("the compile check needs TRITON_INTERPRET=0 (use run_subprocess from an "
                           "interpreter process)")
    import triton

    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    tv = getattr(triton, "__version__", "?")
    report = {"triton": tv, "quick": quick, "targets": {}, "rows": [], "unreached": [], "notice": ""}
    every = V.all_kernels()
    unknown = sorted(set(kernels or ()) - set(every))
    if unknown:
        raise ValueError(f"unknown kernel {unknown[0]!r}: the kernels are {', '.join(sorted(every))}.")
    launched, cache, todo, skipped = set(), _load_cache(), [], []
    combos = V.shapes(quick, **{k: tuple(v) for k, v in (("models", models), ("dtypes", dtypes)) if v})
    checks = V.check_parts(quick, tuple(models) if models else None, tuple(dtypes or V.DTYPES))
    report["skipped"] = skipped
    for name in targets:
        t = V.TARGETS[name]
        ptxas = ptxas_for(t.capability)
        report["targets"][name] = dict(gpus=t.gpus, sms=t.sms, smem_limit=t.smem_block, ptxas=ptxas)
        try:
            vs = V.variants(t, V.record(t, combos, checks, skipped))
        except V.BinderMissing as e:
            report["notice"] = f"triton {tv} lacks the API the compile check uses ({e}): compile check skipped."
            return report
        launched |= {v.kernel for v in vs}
        vs = [v for v in vs if not kernels or v.kernel in kernels]
        progress(f"{name}: {len(vs)} variants of {len({v.kernel for v in vs})} kernels "
                 f"from {len(combos)} shapes and {len(checks)} check parts ({'quick' if quick else 'full'} set)")
        for v in vs:
            task = v.task()
            todo.append((v, t, task, _key(task, t.capability, every[v.kernel], tv, ptxas["release"])))
    if not compile:
        report["rows"] = [evaluate(v, {"ok": True, "skipped": True}, t) for v, t, task, k in todo]
        report["compiled"] = False
        if not kernels:
            report["unreached"] = V.unreached(launched, every, max(V.TARGETS[n].capability for n in targets))
        return report
    missing = [(k, task, t.capability) for v, t, task, k in todo if k not in cache and not v.error]
    report["cached"] = len(todo) - len(missing)
    if missing:
        line = CompileProgress(len(missing), report["cached"], _jobs(jobs, len(missing)), progress)
        line.begin()
        results = {}
        for i, (k, res) in enumerate(_compile_all(missing, jobs)):
            results[k] = res
            if not res.pop("transient", False):       # a crashed worker is not the kernel's fault: retried
                cache[k] = res
            if line.step(i + 1):
                _save_cache(cache)
        cache.update((k, r) for k, r in results.items() if k not in cache)   # this run's rows only
    report["rows"] = [evaluate(v, cache.get(k, {}), t) for v, t, task, k in todo]
    if not kernels:
        report["unreached"] = V.unreached(launched, every, max(V.TARGETS[n].capability for n in targets))
    return report


def _jobs(jobs, n: int) -> int:
    """The compile processes for ``n`` variants: ``jobs``, default the CPU count, at most ``n``."""
    return max(1, min(int(jobs or os.cpu_count() or 1), n))


def _compile_all(missing, jobs):
    """Yield (key, result); in a pool of ``jobs`` processes (default: the CPU count)."""
    jobs = _jobs(jobs, len(missing))
    if jobs == 1:
        for k, task, cc in missing:
            yield k, compile_task(task, cc)
        return
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(compile_task, task, cc): k for k, task, cc in missing}
        for f in as_completed(futs):
            try:
                res = f.result()
            except Exception as e:  # noqa: BLE001 - a crashed worker is that variant's error (not cached)
                res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300], "transient": True}
            yield futs[f], res


# ---- the parent side ----------------------------------------------------------------------

def run_subprocess(targets=("sm_80", "sm_90"), quick=True, kernels=None, jobs=None, timeout=None, *,
                   dtypes=None, models=None, compile=True) -> dict:
    """Run the check in a child process with TRITON_INTERPRET=0; returns its report dict."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DUMP_PTXAS_LOG="1", TRITON_ALWAYS_COMPILE="1")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton 3.9's default, without its warning
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [sys.executable, "-m", "kernels.compile_check", "--json", "--target", ",".join(targets)]
    cmd += ["--quick"] if quick else []
    cmd += [a for k in (kernels or ()) for a in ("--kernel", k)]
    cmd += ["--jobs", str(jobs)] if jobs else []
    cmd += ["--dtype", ",".join(dtypes)] if dtypes else []
    cmd += ["--model", ",".join(models)] if models else []
    cmd += [] if compile else ["--no-compile"]
    with tempfile.TemporaryDirectory(prefix="roofline-triton-cache-") as tmp:
        env["TRITON_CACHE_DIR"] = tmp          # Triton's own cache: fresh, so ptxas always logs
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout)
    try:
        return json.loads(r.stdout)
    except ValueError:
        tail = (r.stdout or "").strip().splitlines()[-1:] or [f"exit status {r.returncode}"]
        return {"notice": f"the compile check could not run: {tail[0][:300]}", "rows": [], "error": True}


def summary(report: dict) -> dict:
    rows = report.get("rows", [])
    n = {s: sum(r["status"] == s for r in rows) for s in ("ok", "warn", "FAIL")}
    return dict(variants=len(rows), ok=n["ok"], warn=n["warn"], failed=n["FAIL"] + len(report.get("unreached", [])),
                cached=report.get("cached", 0), unreached=len(report.get("unreached", [])))


def format_report(report: dict) -> str:
    """The plain table, the notes on warnings and failures, the ptxas per target, a summary line."""
    if report.get("notice") and not report.get("rows"):
        return report["notice"]
    head = ("kernel", "target", "dtype", "config", "grid (max)", "smem / limit", "regs", "spills", "blk/SM", "status")
    lines = []
    for r in report["rows"]:
        smem = f"{r['smem'] / 1024:.1f}/{r['smem_limit'] / 1024:.0f}K" if "smem" in r else "-"
        spills = f"{r['spill_stores']}/{r['spill_loads']}" if r.get("spill_stores") is not None else "-"
        lines.append((r["kernel"], r["target"], r["dtype"], r["config"], "x".join(map(str, r["grid"])), smem,
                      str(r.get("regs", "-")), spills, str(r.get("blocks_per_sm", "-")), r["status"]))
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head)] + [fmt.format(*ln) for ln in lines]
    for r in report["rows"]:
        for msg in r["problems"] + r["warnings"]:
            out.append(f"{r['status']:<4} {r['kernel']} {r['target']} {r['dtype']} [{r['config']}]: {msg} "
                       f"(e.g. {r['example']})")
    for k in report.get("unreached", []):
        out.append(f"FAIL {k}: no launcher reaches it (no variant to compile)")
    for s in report.get("skipped", []):
        out.append(f"note {s} (not run on meta tensors: no Triton launch to compile)")
    for name, t in report.get("targets", {}).items():
        p = t["ptxas"]
        rel = p.get("release", "unknown")
        need = DRIVER_FOR_CUDA.get(int(rel.split(".")[0]) if rel[:1].isdigit() else 0)
        out.append(f"{name} ({t['gpus']}, {t['sms']} SMs): assembled by ptxas {rel} ({p['path']})"
                   + (f"; a driver older than R{need} (CUDA {rel.split('.')[0]}.x) cannot load these cubins"
                      if need else ""))
    s = summary(report)
    done = f"; {s['cached']} from cache" if report.get("compiled", True) else "; discovery only, nothing compiled"
    out.append(f"compile check ({'quick' if report.get('quick') else 'full'} set, triton {report.get('triton')}): "
               f"{s['variants']} variants, {s['ok']} ok, {s['warn']} with spills, {s['failed']} failed"
               + (f" ({s['unreached']} kernels unreached)" if s["unreached"] else "") + done)
    if report.get("notice"):
        out.append(report["notice"])
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.compile_check", description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="sm_80,sm_90")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kernel", action="append", default=[], help="only these kernels (repeatable)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="only these dtypes (comma-separated)")
    ap.add_argument("--model", default=None, help="only these models (comma-separated; 'check': what "
                    "`roofline check --full` launches)")
    ap.add_argument("--no-compile", action="store_true", help="discovery, grid and reach checks only")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    targets = [t.strip() for t in a.target.split(",") if t.strip()]
    bad = [t for t in targets if t not in V.TARGETS]
    if bad:
        print(f"unknown target {bad[0]!r}: choose from {', '.join(V.TARGETS)}", file=sys.stderr)
        return 2
    try:
        kw = dict(dtypes=a.dtype.split(",") if a.dtype else None, models=a.model.split(",") if a.model else None,
                  compile=not a.no_compile)
        if env.INTERPRET:     # this process already chose the interpreter: compile in a child
            report = run_subprocess(targets, a.quick, a.kernel or None, a.jobs, **kw)
        else:
            report = run(targets, a.quick, a.kernel or None, a.jobs, **kw)
    except ImportError as e:   # a triton without ASTSource / GPUTarget / the nvidia backend
        report = {"notice": f"the installed triton lacks the compile API ({e}): compile check skipped.",
                  "rows": []}
    except ValueError as e:    # a bad --kernel / --dtype / --model
        print(json.dumps({"notice": str(e), "rows": [], "error": True}) if a.json else str(e))
        return 2
    print(json.dumps(report) if a.json else format_report(report))
    return 2 if report.get("error") else 1 if summary(report)["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
