"""What the logits-parity tests of the tiny transformers checkpoints share (tests/test_hf_parity_moe.py,
test_hf_parity_hybrid.py, test_hf_parity_mamba.py): the tolerance, the comparison, the model under test, and the
first check each family passes (a prefill, decode steps one token at a time, and the cache-free forward)."""
from __future__ import annotations

import numpy as np
import torch

from kernels.model import LlamaModel
from roofline.models import load_model

TOL = 1e-4   # fp32: max |ours - transformers| over the largest logit


def close(ours, theirs):
    ours = np.asarray(ours.detach() if isinstance(ours, torch.Tensor) else ours, dtype=np.float64)
    err = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert err < TOL, f"max |ours - transformers| = {err:.2e} of the largest logit"


def model(folder, n, backend="torch"):
    """Our model of the checkpoint in ``folder``, fp32, 3 slots of ``n + 2`` tokens."""
    return LlamaModel(load_model(folder), dtype="fp32", backend=backend, max_slots=3, max_len=n + 2)


def prefill_then_decode(folder, ref) -> None:
    """The prompt prefilled, then every later token decoded one a step, then ``forward_full`` over the whole
    sequence: each position's logits equal transformers' (``ref``: hf_tiny's ``Reference``)."""
    seq = torch.tensor(ref.sequence)
    m = model(folder, len(seq))
    assert m.weights_info["weights"] == "checkpoint"
    close(m.prefill(seq[: ref.prompt], 0), ref.decode[ref.prompt - 1])
    for pos in range(ref.prompt, len(seq)):
        close(m.decode_step(seq[pos: pos + 1], [0])[0], ref.decode[pos])
    close(m.forward_full(seq[None]), ref.prefill)
