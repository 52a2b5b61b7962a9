"""Precision: the number formats a weight, an activation or a KV cache is stored in (``formats``: one registry,
counted to the byte with its scales). Nothing else in the package lists dtype names."""

from .formats import (FORMATS, INT4_GROUP, INT4_GROUPS, Format, Scales, act_format, gemm_compute,  # noqa: F401
                      kv_format, lookup, names, register, weight_bytes, weight_format)
