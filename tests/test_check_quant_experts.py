"""`roofline check`'s quantized-expert rows (part "quant", ``kernels.check._moe_quant_checks``): present, passing on
both backends, failing when the kernel reads a wrong scale, and compiled by the quick compile set already.

Run: pytest tests/test_check_quant_experts.py   (about 25 s on 2 cores: interpreter launches on tiny grids, one
variant discovery in a subprocess, nothing compiled)
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernels  # noqa: F401  (the interpreter before triton)
from kernels import check as CK
from kernels import moe as MOE
from kernels.backend import get_ops

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
# the rows' names: case x kind of MOE_QUANT_CASES (GPT-OSS-like skinny, Mixtral-like tiled)
NAMES = ["moe_experts int8 T=5 E=4 k=2 swiglu_oai +bias", "moe_experts int4 g32 T=5 E=4 k=2 swiglu_oai +bias",
         "moe_experts int8 T=40 E=4 k=2 silu", "moe_experts int4 g128 T=40 E=4 k=2 silu",
         "moe_experts int4 g64 zp T=40 E=4 k=2 silu"]


def moe_rows(backend, dtype=torch.float32):
    """The quant part's rows (``_quant_checks``, quick shapes) that are quantized experts."""
    return [r for r in CK._quant_checks(get_ops(backend), dtype, CPU, True) if r.name.startswith("moe_experts")]


def test_the_quant_part_has_a_passing_row_per_quantized_expert_case():
    rows = moe_rows("triton")
    assert [r.name for r in rows] == NAMES
    for r in rows:
        assert r.passed and 0 < r.max_rel_err <= r.tol == CK.KERNEL_TOL["fp32"], str(r)
    # the kernels' configurations: skinny at 10 rows, tiled at 80 (int4 tiled: BLOCK_K = INT4_TILED_BLOCK_K = 32)
    assert [r.detail for r in rows] == ["vs dequantized; skinny, block_k=32"] * 2 + \
        ["vs dequantized; tiled, block_k=32"] * 3
    assert str(rows[0]).startswith("ok   moe_experts int8 T=5 E=4 k=2 swiglu_oai +bias max rel err")


def test_the_torch_backend_rows_pass_and_say_which_gemm_ran():
    rows = moe_rows("torch")
    assert [r.name for r in rows] == NAMES and all(r.passed for r in rows)
    assert all(r.detail.startswith("vs dequantized; per expert: aten._weight_int") for r in rows), \
        [r.detail for r in rows]


def test_bf16_rows_pass_within_the_bf16_tolerance():
    rows = moe_rows("triton", torch.bfloat16)
    assert [r.name for r in rows] == NAMES
    assert all(r.passed and r.tol == CK.KERNEL_TOL["bf16"] for r in rows), [str(r) for r in rows]


def test_a_kernel_that_reads_a_wrong_scale_fails_its_row(monkeypatch):
    """The kernels get expert 0's scales 1% high (a stride or offset bug would look like this); the reference
    dequantizes the stored ones. Every row fails (expert 0 takes most tokens), finitely; the linears' rows pass."""
    real = MOE._weight_args

    def wrong_scales(w):
        args = list(real(w))
        if args[5]:                                   # QUANT != 0: args[2] is the scales tensor
            s = args[2].clone()
            s[0] *= 1.01
            args[2] = s
        return tuple(args)

    monkeypatch.setattr(MOE, "_weight_args", wrong_scales)
    rows = list(CK._quant_checks(get_ops("triton"), torch.float32, CPU, True))
    moe = [r for r in rows if r.name.startswith("moe_experts")]
    assert [r.name for r in moe] == NAMES
    for r in moe:
        assert not r.passed and 1e-3 < r.max_rel_err < 1.0, str(r)   # ~1% of the output, not a NaN
    assert all(r.passed for r in rows if r.name.startswith("linear_"))


_SCRIPT = textwrap.dedent("""
    import json, torch
    from kernels import check as CK, compile_launches as CL, variants as V
    from kernels._launch import recording
    from kernels.backend import get_ops
    t, cpu = V.TARGETS["sm_90"], torch.device("cpu")
    with recording(t.sms) as model:   # GPT-OSS / Mixtral experts of the quick set: decode 1 x 128, prefill 1 x 128
        for ph in ("decode", "prefill"):
            CL.moe_launches(model, dict(model="x", phase=ph, dtype="bf16"), ph, 1, 128, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)
    nan = lambda *s: torch.full(s, float("nan"), dtype=torch.bfloat16)
    with recording(t.sms) as check:   # the check's launches as check_launches replays them (nothing runs)
        check.context = dict(model="check", phase="--full", dtype="bf16", op="quant")
        list(CK._moe_quant_checks(get_ops("triton"), cpu, rnd, nan, True, 1.6e-2))
    have = {v.key for v in V.variants(t, model.launches)}
    vs = V.variants(t, check.launches)
    print(json.dumps(dict(launches=len(check.launches), variants=len(vs),
                          new=[v.kernel + " " + v.config for v in vs if v.key not in have])))
""")


def test_the_checks_launches_are_variants_the_quick_compile_set_already_has(tmp_path):
    """``variants.check_launches`` replays the quant part in bf16 in the quick compile set: the quantized-expert
    rows' 10 launches (5 rows x gate_up + down) bind to the variants of GPT-OSS's and Mixtral's quantized experts
    (``variants.MOE_QUANT``) exactly, signature and divisibility included, so they add no compilation."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="no NVIDIA backend in this triton")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["launches"] == 10 and out["variants"] == 10 and out["new"] == [], out
