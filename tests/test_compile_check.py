"""``roofline check --compile``: every kernel variant compiled for sm_80 / sm_90 with no GPU.

Fast tests: the parsers and limits on made-up numbers; variant discovery of the whole quick set
(no compilation); a handful of real compilations (the fp32 tiles that used to spill); the CLI on
one small kernel, cold then warm (cached). The whole quick set compiled (about a minute cold on
2 cores, seconds warm) runs with ROOFLINE_SLOW_TESTS=1, or as `roofline check --compile --quick`.

Run: pytest tests/test_compile_check.py
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import kernels  # noqa: F401
from kernels import compile_check as C
from kernels import variants as V
from profiler.cli import main
from profiler.commands.check import driver_notes

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("triton.backends.nvidia.compiler", reason="no NVIDIA backend in this triton")


def test_ptxas_and_cuobjdump_output_are_parsed():
    log = ("ptxas info    : Compiling entry function '_k' for 'sm_90a'\n"
           "    7184 bytes stack frame, 31232 bytes spill stores, 39956 bytes spill loads\n"
           "ptxas info    : Used 32 registers, used 1 barriers, 7184 bytes cumulative stack size\n")
    assert C.parse_ptxas_log(log) == dict(stack=7184, spill_stores=31232, spill_loads=39956, regs_ptxas=32)
    res = "Resource usage:\n Function _k:\n  REG:216 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:616 TEXTURE:0\n"
    assert C.parse_res_usage(res) == dict(regs=216, stack=0, static_shared=1024, local=0)


def test_blocks_per_sm_and_the_limits():
    h100 = V.TARGETS["sm_90"]
    # 130 regs x 8 warps: 136 x 32 = 4352 per warp -> 15 warps -> 1 block; 96 KiB smem would allow 2
    assert C.blocks_per_sm(130, 96 * 1024, 8, h100) == 1
    assert C.blocks_per_sm(32, 0, 4, h100) == 16          # 2048 threads / 128
    v = V.Variant("sm_90", "_k", "kernels.x", "bf16", {"x_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"},
                  {(2,): 128}, {}, 8, 3, launches=[((10, 70000, 1), "some shape")])
    row = C.evaluate(v, {"ok": True, "shared": 240_000, "regs": 255, "spill_stores": 8, "spill_loads": 8}, h100)
    assert row["status"] == "FAIL" and row["config"] == "BLOCK=128 w8 s3"
    text = " | ".join(row["problems"])
    assert "shared memory 240,000 B > 232,448 B" in text and "axis 1 = 70000 > 65535" in text
    assert row["warnings"] == ["spills 8 B stored / 8 B loaded per thread"]
    v16 = V.Variant("sm_80", "_k", "kernels.x", "fp32", {}, {}, {}, 16, 2, launches=[((1, 1, 1), "s")])
    row = C.evaluate(v16, {"ok": True, "shared": 0, "regs": 168}, V.TARGETS["sm_80"])
    assert row["status"] == "FAIL" and "168 registers x 512 threads = 86,016 > 65,536" in row["problems"][0]
    assert C.evaluate(v16, {"ok": False, "error": "CompilationError: boom"}, V.TARGETS["sm_80"])["problems"] == \
        ["CompilationError: boom"]
    ok = C.evaluate(v16, {"ok": True, "shared": 0, "regs": 40, "spill_stores": 0, "spill_loads": 0},
                    V.TARGETS["sm_80"])
    assert ok["status"] == "ok" and ok["blocks_per_sm"] == 3     # 40 x 32 = 1280 regs a warp: 51 warps, 3 x 16


def test_a_kernel_no_launcher_reaches_is_found():
    class K:
        def __init__(self, src):
            self.src = src
    ks = {"_main": K("def _main(x):\n    y = _helper(x)\n"), "_helper": K("def _helper(x): ..."),
          "_orphan": K("def _orphan(x): ...")}
    assert V.unreached({"_main"}, ks) == ["_orphan"]
    report = {"rows": [], "unreached": ["_orphan"], "targets": {}}
    assert C.summary(report)["failed"] == 1 and "FAIL _orphan: no launcher reaches it" in C.format_report(report)


def test_an_interpreter_function_has_no_binder_a_notice_not_a_crash():
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from kernels.linear import _linear_kernel          # the interpreter's wrapper in this process
    with pytest.raises(V.BinderMissing):
        V._binder(_linear_kernel, make_backend(GPUTarget("cuda", 90, 32)), {})


def test_the_cli_prints_a_notice_when_triton_lacks_the_api(monkeypatch):
    notice = "triton 3.0.0 lacks the API the compile check uses (...): compile check skipped."
    monkeypatch.setattr(C, "run_subprocess", lambda *a, **k: {"notice": notice, "rows": []})
    r = CliRunner().invoke(main, ["check", "--compile", "--quick"])
    assert r.exit_code == 0 and r.output.strip().splitlines()[0] == notice
    r = CliRunner().invoke(main, ["check", "--compile", "--target", "sm_70"])
    assert r.exit_code == 2 and "unknown target 'sm_70'" in r.output
    r = CliRunner().invoke(main, ["check", "--quick"])
    assert r.exit_code == 2 and "go with --compile" in r.output


def test_driver_older_than_the_ptxas_is_said():
    rep = {"targets": {"sm_80": {"ptxas": {"release": "12.9"}}, "sm_90": {"ptxas": {"release": "13.4"}}}}
    notes = driver_notes(rep, "12.4")
    assert len(notes) == 1 and notes[0].startswith("WARNING sm_90: assembled by ptxas 13.4")
    assert driver_notes(rep, "13.0") == [] and driver_notes(rep, None) == []


def test_discovery_covers_every_kernel_and_grids_fit(tmp_path):
    # sm_90 here; .ci/run's `roofline check --compile --quick` discovers and compiles both targets
    rep = C.run_subprocess(("sm_90",), quick=True, compile=False, timeout=300)
    assert not rep.get("notice"), rep.get("notice")
    assert rep["unreached"] == [] and rep["compiled"] is False
    rows = rep["rows"]
    kernels_seen = {r["kernel"] for r in rows}
    assert {"_linear_kernel", "_prefill_attn_kernel", "_decode_split_kernel", "_decode_merge_kernel",
            "_rmsnorm_kernel", "_rope_kernel", "_kv_append_kernel", "_swiglu_kernel", "_add_kernel",
            "_embedding_kernel", "_linear_int8_kernel", "_linear_int4_kernel", "_geglu_kernel",
            "_mla_decode_split_kernel", "_mla_decode_merge_kernel",
            "_moe_gate_up_kernel", "_moe_down_kernel", "_linear_fp8_kernel", "_act_quant_kernel",
            "_linear_fp4_kernel", "_verify_split_kernel", "_conv1d_kernel", "_ssd_cumsum_kernel",
            "_ssd_chunk_state_kernel", "_ssd_state_pass_kernel", "_ssd_chunk_scan_kernel", "_ssd_step_kernel",
            "_gated_group_norm_kernel", "_chunk_prep_kernel", "_chunk_kernel", "_recurrent_kernel",
            "_gates_kernel", "_gated_norm_kernel", "_sigmoid_gate_kernel", "_index_scores_kernel",
            "_mla_sparse_split_kernel", "_relu2_kernel"} == kernels_seen
    # "a few hundred" for one target: 576 with the sink (GPT-OSS), quantized-expert and 8-bit KV + sink variants;
    # 602 (+26) with FP8 (issue 29): 10 W8A8 GEMMs, 6 act quants, 10 attention over a per-tensor fp8 KV cache;
    # 630 (+28) with FP4: mxfp4 / nvfp4 q_proj linears and GPT-OSS / Mixtral experts in bf16; 659 (+21) with Llama-4's
    # chunked attention (the CHUNK variants of prefill and decode); +30 with the verify step (issue 34: 26 verify
    # split variants, int8 KV included, the rest the merges of its T x Hq rows); +37 with Mamba-2 (issue 32: its
    # bounded sample, compile_launches.MAMBA_*, and roofline check's mamba rows); +44 with Gated DeltaNet (issue 32:
    # its 7 kernels at Qwen3-Next's sizes and roofline check's shapes, 3 dtypes); +8 with DSA (V3.2's shapes, bf16);
    # ReLU² and the ungated relu2 experts (Nemotron-H, issue 32: float only)
    assert 150 <= len(rows) <= 830
    mamba = [r for r in rows if r["kernel"] in ("_conv1d_kernel", "_gated_group_norm_kernel")
             or r["kernel"].startswith("_ssd_")]
    assert len(mamba) <= 40, len(mamba)
    # roofline check --dtype bf16 --full's launches are in the quick set: M=1000 N=1100 K=700 (issue 21)
    full = [r for r in rows if r["kernel"] == "_linear_kernel" and r["example"].startswith("check --full bf16")]
    assert any("BLOCK_M=128 BLOCK_N=64 BLOCK_K=64" in r["config"] and r["config"].endswith("w8 s3")
               for r in full), [r["config"] for r in full]
    assert all(r["status"] == "ok" for r in rows), [r["problems"] for r in rows if r["status"] != "ok"]
    assert {r["target"] for r in rows} == {"sm_90"}


_COMPILE_SCRIPT = textwrap.dedent("""
    import json, torch
    from kernels import compile_check as C, variants as V
    from kernels import decode_attention as DA, linear as L, prefill_attention as PA
    from kernels._launch import recording
    meta, f32 = torch.device("meta"), torch.float32
    q = torch.empty(1, 4096, 32, 128, dtype=f32, device=meta)
    kc = torch.empty(1, 8, 4096, 128, dtype=f32, device=meta)
    cases = {
        "sm_90 prefill fp32 D=128": ("sm_90", lambda: PA.prefill_attention(q, kc, kc, torch.arange(1, device=meta))),
        "sm_80 decode fp32": ("sm_80", lambda: DA.decode_attention(q[:, 0], kc, kc, torch.empty(1, dtype=torch.long,
                              device=meta), torch.arange(1, device=meta), max_len=4096)),
        "sm_80 skinny linear fp32 M=64": ("sm_80", lambda: L.linear(torch.empty(64, 4096, dtype=f32, device=meta),
                                          torch.empty(4096, 4096, dtype=f32, device=meta))),
    }
    # roofline check --dtype bf16 --full's GEMM (N, K not multiples of 16): 255 registers, ~1 KB spilled (issue 21)
    bf = torch.bfloat16
    for tgt in ("sm_80", "sm_90"):
        cases[f"{tgt} check --full linear bf16 1000x1100x700"] = (tgt, lambda: L.linear(
            torch.empty(1000, 700, dtype=bf, device=meta), torch.empty(700, 1100, dtype=bf, device=meta)))
    from kernels import linear_int4 as L4
    from kernels.quant_weight import QuantWeight
    q4 = QuantWeight("int4", torch.empty(11008, 2048, dtype=torch.uint8, device=meta),
                     torch.empty(64, 11008, dtype=bf, device=meta), torch.empty(64, 11008, dtype=bf, device=meta),
                     4096, 11008, 64)
    cases["sm_90 int4 g64 zp Llama-2-7B gate_proj b=16"] = ("sm_90", lambda: L4.linear_int4(
        torch.empty(16, 4096, dtype=bf, device=meta), q4))
    out = {}
    for name, (tgt, call) in cases.items():
        t = V.TARGETS[tgt]
        with recording(t.sms) as rec:
            call()
        v = V.variants(t, rec.launches)[0]
        out[name] = C.evaluate(v, C.compile_task(v.task(), t.capability), t)
    # a launcher bug: an argument too few for the kernel is a failing row, not a crash
    from kernels.residual import _add_kernel
    from kernels._launch import launch
    x = torch.empty(8, device=meta)
    with recording(132) as rec:
        launch(_add_kernel, (1,), x, x, x, BLOCK=1024)
    (bad,) = V.variants(V.TARGETS["sm_90"], rec.launches)
    out["bad launch"] = C.evaluate(bad, {}, V.TARGETS["sm_90"])
    print(json.dumps(out))
""")


def test_fp32_tiles_compile_without_spills(tmp_path):
    """The fp32 configs that spilled (30 KB/thread on sm_90 prefill, 255 regs on sm_80) compile clean."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DUMP_PTXAS_LOG="1", TRITON_ALWAYS_COMPILE="1",
               PYTHONPATH=str(ROOT), TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    bad = rows.pop("bad launch")
    assert bad["status"] == "FAIL" and "does not bind to the kernel" in bad["problems"][0]
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["problems"], row["warnings"])
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, name
        assert row["regs"] < 255 and row["blocks_per_sm"] >= 1, (name, row)
    assert rows["sm_90 prefill fp32 D=128"]["config"].startswith("BLOCK_M=32 BLOCK_N=16 BLOCK_D=128")


def test_linear_config_unaligned_shapes_take_the_8_warp_tile_aligned_ones_keep_theirs():
    import torch

    from kernels._launch import recording
    from kernels.linear import linear_config

    with recording(132):
        full = linear_config(1000, 1100, 700, torch.bfloat16, "meta")       # roofline check --full's GEMM
        prefill = linear_config(128, 4096, 4096, torch.bfloat16, "meta")     # Llama q_proj, 128-token prompt
        fp32 = linear_config(1000, 1100, 700, torch.float32, "meta")
    assert (full["block_m"], full["block_n"], full["block_k"], full["num_warps"], full["split_k"]) == (128, 64, 64, 8, 1)
    assert (prefill["block_m"], prefill["block_n"], prefill["num_warps"], prefill["split_k"]) == (128, 128, 8, 6)
    assert (fp32["block_m"], fp32["block_n"], fp32["block_k"]) == (64, 64, 32)


def test_the_full_set_covers_every_preset_and_check_parts():
    from roofline.models import PRESETS

    full = V.shapes(False, dtypes=("bf16",))
    assert {m for m, *_ in full} == set(PRESETS)
    assert ("mixtral-8x7b", "decode", 16, 1024, "bf16") in full and ("llama-2-7b", "decode", 16, 2048, "bf16") in full
    assert not any(m == "tiny" and c > 512 for m, _, _, c, _ in full)              # each model's max context
    assert {m for m, *_ in V.shapes(True)} == set(V.MODELS)
    assert V.check_parts(True) == (("bf16", "kernels"), ("bf16", "quant"))
    assert len(V.check_parts(False)) == 12 and V.check_parts(False, models=("mistral-7b",)) == ()
    assert V.check_parts(True, models=(V.CHECK,), dtypes=("fp16",))[-1] == ("fp16", "quant model")


def test_moe_and_mla_presets_record_their_own_kernels_on_meta():
    skipped = []
    launches = V.record(V.TARGETS["sm_90"], [("gpt-oss-20b", "decode", 16, 128, "bf16"),
                                              ("deepseek-v3", "decode", 1, 128, "bf16")], (), skipped)
    by_model = {}
    for ln in launches:
        by_model.setdefault(ln.context.get("model"), set()).add(ln.name)
    assert {"_moe_gate_up_kernel", "_moe_down_kernel", "_linear_kernel"} <= by_model["gpt-oss-20b"]
    assert {"_mla_decode_split_kernel", "_linear_kernel"} <= by_model["deepseek-v3"]
    assert "_decode_merge_kernel" in by_model["gpt-oss-20b"] and not any("decode attention" in s for s in skipped)


def test_cli_compiles_a_kernel_cold_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    args = ["check", "--compile", "--quick", "--target", "sm_90", "--kernel", "_embedding_kernel", "--jobs", "1"]
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    cold = json.loads(r.output)
    assert cold["cached"] == 0 and len(cold["rows"]) >= 3 and all(x["status"] == "ok" for x in cold["rows"])
    assert all(x["regs"] > 0 and x["smem"] >= 0 for x in cold["rows"])
    assert cold["targets"]["sm_90"]["ptxas"]["release"][0].isdigit()
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert f"0 failed; {len(cold['rows'])} from cache" in r.output and "assembled by ptxas" in r.output
    assert (tmp_path / "compile-check.json").exists()


@pytest.mark.skipif(not os.environ.get("ROOFLINE_SLOW_TESTS"), reason="about a minute cold: ROOFLINE_SLOW_TESTS=1")
def test_the_whole_quick_set_compiles_clean():
    rep = C.run_subprocess(("sm_80", "sm_90"), quick=True, timeout=900)
    s = C.summary(rep)
    assert s["failed"] == 0 and s["warn"] == 0, C.format_report(rep)
