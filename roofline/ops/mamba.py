"""Mamba-2's kind (Nemotron-H, Granite-4.0-H: ``roofline.formulas.mamba``): ssd_scan, the SSD chunked scan in
prefill and the recurrent step in decode (the SSM state read and written per sequence), reading A_log, dt_bias
and D. Its conv1d and gated RMSNorm are Gated DeltaNet's kinds (``roofline.ops.deltanet``: conv1d with its
bias, gated_norm over the inner width); in_proj and out_proj are linears."""

from __future__ import annotations

from .. import formulas as F
from .registry import OpKind, register


def _ssd(op, s):
    d, a = op.dims, s.dtypes.act
    sizes = (d["heads"], d["head_dim"], d["state"], d["groups"])
    if s.decode:
        return F.ssd_decode(s.batch, *sizes, act_dtype=a)
    return F.ssd_prefill(s.batch, s.chunk, *sizes, chunk=d["chunk"], act_dtype=a,
                         reads_state=s.decode or s.cached > 0)


# tensor: the chunked prefill's products run on tensor cores (mamba_ssm's tl.dot); decode is bound by the state
SSD_SCAN = register(OpKind("ssd_scan", "attention", _ssd, tensor=True, per_sequence=True))
