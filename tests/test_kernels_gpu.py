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
