"""Regenerate the recorded result files the report and analysis tests read.

    python tests/data/make_fixtures.py      # rewrites tests/data/reports_*.jsonl

* ``reports_h100.jsonl``: synthetic GPU-like run. Device h100 with "measured" ceilings
  (3.0 TB/s copy, 800 TFLOP/s bf16 GEMM; fp32 left at the datasheet), llama-3-8b, every op
  of ``roofline.workload`` over decode batches 1..128 x contexts 128..4096 and prefill
  batches 1, 8 x prompts 128..4096. Times = roof time / an efficiency that varies by op
  and size + a 3.5 us launch, with 1% seeded noise. Deliberately interesting points: decode
  attention at batch 8, context 128 runs *above* its roof (KV cache held in L2), prefill
  attention at batch 8 x 4096 is skipped ("out of memory"), one point has a wide spread,
  and decode batch 1 also measures the whole ``layer`` op.
* ``reports_a100.jsonl``: the same model on an a100, fewer points, for side by side.
* ``reports_exact.jsonl``: a hand-made device and costs with round numbers, so the
  analysis tests can show their arithmetic (see tests/test_reports_analysis.py).
* ``reports_two_backends.jsonl``: the same decode steps on the triton and the torch backend,
  round numbers, where each backend's largest kernel differs: every consumer must keep the
  two apart (tests/test_one_analysis.py).

Before/after pairs for ``roofline compare`` (tests/test_compare.py), each with a known answer:

* ``reports_h100_slow_op.jsonl``: ``reports_h100.jsonl`` line for line, except that one op
  (``SLOW_OP``: decode o_proj at batch 32, context 1,024) takes exactly twice as long.
* ``reports_h100_w8.jsonl``: the h100 sweep with int8 weights (same device, grid and timing
  model, fresh noise, none of the specials): decode moves about half the bytes.
* ``latency_sweep_cpu_late.jsonl``: ``latency_sweep_cpu.jsonl`` with every token of every
  request delivered ``LATE_S`` later: TTFT (and E2E) up by exactly that, TPOT and ITL the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from roofline import workload as W
from roofline.bounds import predicted_time
from roofline.cost import Cost
from roofline.devices import Device, find_device
from roofline.models import PRESETS
from roofline.records import Measurement, RunHeader, WorkloadPoint
from roofline.writer import ResultWriter

HERE = Path(__file__).parent
LAUNCH_S = 3.5e-6


def _sig(x: float, n: int = 4) -> float:
    return float(f"{x:.{n}g}")


def _efficiency(op: str, cost: Cost, ridge: float) -> float:
    """Fraction of the roof a plausible kernel reaches: big GEMMs near 80%, small vector ops less."""
    if op.endswith("_proj") or op == "lm_head":
        return 0.72 if cost.intensity >= ridge else 0.86
    if op == "attention":
        return 0.55 if cost.intensity >= ridge else 0.78
    return 0.65  # elementwise and norms: memory-bound, modest


def _header(device: Device, datasheet: Device, model, settings, command, gpu_name, clocks) -> RunHeader:
    return RunHeader(
        device=device, datasheet=datasheet, model=model.to_dict(), kind="profile", dtype="bf16",
        ceilings={"bandwidth": {"value": device.bandwidth, "method": "device-to-device copy of 4 GiB, "
                                "bytes read + written, median of 20"},
                  "bf16": {"value": device.peak_flops["bf16"], "method": "8192^3 GEMM, random normal data"}},
        settings=settings, versions={"roofline": "0.1.0", "torch": "2.4.1+cu124", "triton": "3.0.0",
                                     "cuda": "12.4", "driver": "550.90.07", "python": "3.11.9"},
        git_sha="0123456789abcdef0123456789abcdef01234567", command=command,
        started="2025-01-15T10:00:00+00:00",
        host={"gpu": gpu_name, "sm_clock_mhz": clocks[0], "sm_clock_max_mhz": clocks[1],
              "mem_clock_mhz": clocks[2], "power_limit_w": clocks[3], "temperature_c": 41, "throttle_reasons": 0},
    )


def _sweep(path, device, datasheet, gpu_name, clocks, decode_grid, prefill_grid, rng, specials=True,
           weight_dtype="bf16"):
    model = PRESETS["llama-3-8b"]
    settings = {"phases": ["prefill", "decode"], "decode_batches": sorted({b for b, _ in decode_grid}),
                "decode_contexts": sorted({c for _, c in decode_grid}),
                "prefill_batches": sorted({b for b, _ in prefill_grid}),
                "prefill_contexts": sorted({c for _, c in prefill_grid}), "backends": ["torch"], "reps": 3}
    command = (f"roofline profile --model llama-3-8b --device {device.key} --phases prefill,decode "
               f"--batches {','.join(map(str, settings['decode_batches']))} "
               f"--contexts {','.join(map(str, settings['decode_contexts']))} --out roofline-out"
               + (f" --weight-dtype {weight_dtype}" if weight_dtype != "bf16" else ""))
    header = _header(device, datasheet, model, settings, command, gpu_name, clocks)
    steps = ([W.prefill(model, b, c, weight_dtype=weight_dtype) for b, c in prefill_grid]
             + [W.decode(model, b, c, weight_dtype=weight_dtype) for b, c in decode_grid])
    with ResultWriter(path, header, mode="overwrite") as w:
        for ph in steps:
            ops = list(ph.ops)
            for op in ops:
                point = WorkloadPoint(model=model.name, op=op.name, phase=ph.phase, batch=ph.batch,
                                      new_tokens=ph.new_tokens, context=ph.context, cost=op.cost, dtype="bf16",
                                      backend="torch", compute_dtype=op.compute_dtype, weight_dtype=weight_dtype)
                peak, bw = device.peak(op.compute_dtype), device.bandwidth
                t = predicted_time(op.cost, peak, bw) / _efficiency(op.name, op.cost, peak / bw) + LAUNCH_S
                spread = 0.01
                status, reason = "ok", ""
                if specials and ph.phase == "decode" and (ph.batch, ph.context) == (8, 128) and op.name == "attention":
                    t = predicted_time(op.cost, peak, bw) * 0.62  # KV cache (4 MiB/layer) served from L2
                if specials and ph.phase == "decode" and (ph.batch, ph.context) == (32, 1024) and op.name == "swiglu":
                    spread = 0.2
                if specials and ph.phase == "prefill" and (ph.batch, ph.context) == (8, 4096) and op.name == "attention":
                    status, reason = "skipped", "out of memory"
                times = () if status != "ok" else tuple(_sig(t * (1 + spread * rng.standard_normal())) for _ in range(3))
                w.write(Measurement(point=point, times_s=times, timer="cuda-events", l2_policy="flushed",
                                    config={"impl": "torch"}, device=gpu_name,
                                    clocks={"sm_mhz": clocks[0], "mem_mhz": clocks[2]},
                                    status=status, reason=reason))
            if specials and ph.phase == "decode" and ph.batch == 1:
                layer = sum((o.cost for o in ops if o.name not in ("embedding", "final_norm", "lm_head")), Cost(0, 0))
                t_layer = sum(predicted_time(o.cost, device.peak(o.compute_dtype), device.bandwidth)
                              / _efficiency(o.name, o.cost, 300) for o in ops if o.name not in ("embedding", "final_norm", "lm_head")) + 8e-6
                point = WorkloadPoint(model=model.name, op="layer", phase="decode", batch=ph.batch, new_tokens=1,
                                      context=ph.context, cost=layer, compute_dtype="bf16")
                w.write(Measurement(point=point, times_s=tuple(_sig(t_layer * (1 + 0.01 * rng.standard_normal()))
                                                              for _ in range(3)),
                                    timer="cuda-graph", l2_policy="flushed", device=gpu_name))


def make_gpu_files():
    rng = np.random.default_rng(20250115)
    sheet = find_device("h100")
    h100 = sheet.with_ceilings({"bf16": 800e12}, bandwidth=3.0e12, source="measured",
                               provenance="measured: 4 GiB device copy and 8192^3 bf16 GEMM")
    decode = [(b, c) for b in (1, 8, 32, 128) for c in (128, 1024, 4096)]
    prefill = [(b, c) for b in (1, 8) for c in (128, 1024, 4096)]
    _sweep(HERE / "reports_h100.jsonl", h100, sheet, "NVIDIA H100 80GB HBM3", (1980, 1980, 2619, 700),
           decode, prefill, rng)
    sheet = find_device("a100")
    a100 = sheet.with_ceilings({"bf16": 280e12}, bandwidth=1.75e12, source="measured",
                               provenance="measured: 4 GiB device copy and 8192^3 bf16 GEMM")
    decode = [(b, 1024) for b in (1, 8, 32, 128)]
    prefill = [(1, c) for c in (128, 1024, 4096)]
    _sweep(HERE / "reports_a100.jsonl", a100, sheet, "NVIDIA A100-SXM4-80GB", (1410, 1410, 1593, 400),
           decode, prefill, rng, specials=False)


def make_exact_file():
    """Round numbers: bandwidth 1e12 B/s, bf16 peak 1e14 FLOP/s (ridge 100), fp32 1e13, 2 layers."""
    sheet = Device(key="testdev", name="Test device", kind="gpu",
                   peak_flops={"bf16": 2e14, "fp32": 1e13}, bandwidth=2e12, source="datasheet", provenance="made up")
    dev = sheet.with_ceilings({"bf16": 1e14}, bandwidth=1e12, source="measured", provenance="made up, measured")
    model = PRESETS["tiny"]  # n_layers = 2
    header = RunHeader(device=dev, datasheet=sheet, model=model.to_dict(), dtype="bf16",
                       command="roofline profile --model tiny", versions={"roofline": "0.1.0"})

    def m(op, phase, batch, context, flops, nbytes, t, compute="bf16", status="ok", reason=""):
        p = WorkloadPoint(model="tiny", op=op, phase=phase, batch=batch, new_tokens=1 if phase == "decode" else context,
                          context=context, cost=Cost(flops, nbytes), compute_dtype=compute)
        return Measurement(point=p, times_s=(t, t, t) if status == "ok" else (), timer="cuda-events",
                           status=status, reason=reason)

    rows = [
        # decode, batch 1, context 100
        m("embedding", "decode", 1, 100, 0, 4e7, 5e-5, compute="fp32"),
        m("q_proj", "decode", 1, 100, 2e9, 1e9, 1.25e-3),
        m("attention", "decode", 1, 100, 4e8, 1.8e8, 2.25e-4),
        m("layer", "decode", 1, 100, 9e9, 9e9, 1.0),          # left out of the sum
        m("lm_head", "decode", 1, 100, 1e9, 5e8, 0, status="skipped", reason="out of memory"),
        # prefill, batch 1, 1000 tokens
        m("q_proj", "prefill", 1, 1000, 2e12, 1.5e10, 0.045),
        m("kv_append", "prefill", 1, 1000, 0, 1e9, 5e-3, compute="fp32"),
        # decode, batch 2, context 100: only the layer op
        m("layer", "decode", 2, 100, 1e9, 1e9, 1e-2),
    ]
    with ResultWriter(HERE / "reports_exact.jsonl", header, mode="overwrite") as w:
        for r in rows:
            w.write(r)


def make_two_backend_file():
    """Device: bandwidth 1e12 B/s, bf16 1e14 FLOP/s (ridge 100), fp32 1e13; model tiny (2 layers).

    decode, context 100        triton                      torch
      batch 1  q_proj          2 ms                        1.25 ms
               attention       5 ms   (largest kernel)     0.25 ms
      batch 8  q_proj          2.2 ms                      1.5 ms
               attention       8 ms   (largest kernel)     1.5 ms
    """
    dev = Device(key="toy", name="Toy GPU", kind="gpu", peak_flops={"bf16": 1e14, "fp32": 1e13}, bandwidth=1e12,
                 source="measured", provenance="made up")
    header = RunHeader(device=dev, model=PRESETS["tiny"], dtype="bf16", command="roofline profile --model tiny",
                       versions={"roofline": "0.1.0"}, settings={"backends": ["triton", "torch"]})
    times = {("triton", 1): (2e-3, 5e-3), ("torch", 1): (1.25e-3, 2.5e-4),
             ("triton", 8): (2.2e-3, 8e-3), ("torch", 8): (1.5e-3, 1.5e-3)}
    cost = {1: (Cost(2e9, 1e9), Cost(4e8, 1.8e8)), 8: (Cost(16e9, 1.1e9), Cost(3.2e9, 1.44e9))}
    with ResultWriter(HERE / "reports_two_backends.jsonl", header, mode="overwrite") as w:
        for (backend, batch), (tq, ta) in times.items():
            for op, c, t in (("q_proj", cost[batch][0], tq), ("attention", cost[batch][1], ta)):
                p = WorkloadPoint(model="tiny", op=op, phase="decode", batch=batch, new_tokens=1, context=100, cost=c,
                                  backend=backend, compute_dtype="bf16")
                w.write(Measurement(point=p, times_s=(t, t, t), timer="cuda-events", l2_policy="flushed"))


SLOW_OP = ("o_proj", "decode", 32, 1024)   # (op, phase, batch, context) made 2x slower
LATE_S = 0.5                               # every delivery of latency_sweep_cpu_late.jsonl, later by this


def make_compare_files():
    """The before/after pairs (see the module docstring); reads the files the functions above wrote."""
    from dataclasses import replace

    from roofline.latency import RequestTimeline, summarize
    from roofline.records import json_line, read_results

    rf = read_results(HERE / "reports_h100.jsonl")
    with ResultWriter(HERE / "reports_h100_slow_op.jsonl", rf.header, mode="overwrite") as w:
        for m in rf.measurements:
            p = m.point
            if (p.op, p.phase, p.batch, p.context) == SLOW_OP:
                m = replace(m, times_s=tuple(2 * t for t in m.times_s))
            w.write(m)

    sheet = find_device("h100")
    h100 = sheet.with_ceilings({"bf16": 800e12}, bandwidth=3.0e12, source="measured",
                               provenance="measured: 4 GiB device copy and 8192^3 bf16 GEMM")
    decode = [(b, c) for b in (1, 8, 32, 128) for c in (128, 1024, 4096)]
    prefill = [(b, c) for b in (1, 8) for c in (128, 1024, 4096)]
    _sweep(HERE / "reports_h100_w8.jsonl", h100, sheet, "NVIDIA H100 80GB HBM3", (1980, 1980, 2619, 700),
           decode, prefill, np.random.default_rng(20250116), specials=False, weight_dtype="int8")

    src = HERE / "latency_sweep_cpu.jsonl"
    lines = src.read_text().splitlines()
    done: dict = {}
    out = [lines[0]]
    for line in lines[1:]:
        d = json.loads(line)
        if d.get("type") == "request":
            t = RequestTimeline.from_dict(d)
            t = replace(t, deliveries=tuple(x + LATE_S for x in t.deliveries), finish=t.finish + LATE_S)
            done.setdefault((t.config, t.attempt), []).append(t)
            line = json_line(t.to_dict()).rstrip("\n")
        elif d.get("type") == "latency-summary":   # recomputed from the later requests
            ts = done.get((d["config"], d.get("attempt", 1)), [])
            s = summarize(ts, d.get("slo") or {}, d["config"], d.get("settings") or {}, tuple(d["formulas"]))
            line = json_line({**s.to_dict(), "attempt": d.get("attempt", 1)}).rstrip("\n")
        out.append(line)
    (HERE / "latency_sweep_cpu_late.jsonl").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    make_gpu_files()
    make_exact_file()
    make_two_backend_file()
    make_compare_files()
    for p in sorted(HERE.glob("reports_*.jsonl")):
        print(f"{p}  {p.stat().st_size / 1e3:.0f} kB  {sum(1 for _ in open(p)) - 1} records")
