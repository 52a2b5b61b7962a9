"""GPU-only: every check at larger shapes with the default (GPU) block sizes, natively compiled.

Run on a GPU box: pytest -m gpu tests/test_kernels_gpu.py
"""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_full_checks_on_gpu(backend, dtype):
    from kernels.check import run_checks

    bad = [str(r) for r in run_checks(backend, dtype, device="cuda", quick=False) if not r.passed]
    assert not bad, bad


def test_runners_llama3_8b_decode_on_gpu():
    from kernels.runners import make_runners
    from roofline.models import load_model

    rs = make_runners(load_model("llama-3-8b"), "decode", 8, 1024, device="cuda")
    for r in rs:
        r.fn()
    torch.cuda.synchronize()


def test_cuda_split_k_in_one_launch_repeats_and_replays():
    """The last program of a tile adds the partials and resets its counter: again and again, and in a graph."""
    from kernels import linear as L
    from kernels.check_result import rel_err

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 4096, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(4096, 1024, device="cuda", generator=g).to(torch.bfloat16)
    ref = x.double() @ w.double()
    assert L.linear_config(1, 1024, 4096, torch.bfloat16, "cuda")["split_k"] > 1
    outs = [L.linear(x, w) for _ in range(5)]
    assert all(rel_err(o, ref) < 1.6e-2 for o in outs) and all(torch.equal(o, outs[0]) for o in outs)
    y = torch.empty_like(outs[0])
    L.linear(x, w, out=y)                                     # warm the counters before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        L.linear(x, w, out=y)
    for _ in range(3):
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, outs[0])


def test_cuda_length_zero_decode_is_zeros():
    from kernels import decode_attention as DA

    kc = torch.randn(3, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(3, 32, 128, device="cuda", dtype=torch.bfloat16)
    lens, slots = torch.tensor([0, 4096, 17], device="cuda"), torch.arange(3, device="cuda")
    o = DA.decode_attention(q, kc, kc, lens, slots, max_len=4096)
    assert torch.isfinite(o).all() and not o[0].any()


def test_quantized_runners_on_gpu():
    """int8 / int4 weights and an 8-bit KV cache (fp8 where the GPU has it) on both backends, natively compiled."""
    from kernels.quant import fp8_supported
    from kernels.runners import make_runners
    from roofline.models import load_model

    kv = "fp8" if fp8_supported("cuda") else "int8"
    for backend in ("triton", "torch"):
        for wd in ("int8", "int4"):
            for r in make_runners(load_model("llama-3-8b"), "decode", 8, 1024, device="cuda", backend=backend,
                                  weight_dtype=wd, kv_dtype=kv):
                r.fn()
    torch.cuda.synchronize()
