"""Precision: the number formats a weight, an activation or a KV cache is stored in (``formats``: one registry,
counted to the byte with its scales), each module's precision (``modules``: ``Precision``, from the flags) and
the checkpoint's own (``checkpoint``: ``quantization_config`` / ``hf_quant_config.json``). Nothing else in the
package lists dtype names."""

from .formats import (FORMATS, INT4_GROUP, INT4_GROUPS, Format, Scales, act_format, gemm_compute,  # noqa: F401
                      kv_format, lookup, names, register, weight_bytes, weight_format, run_names)
from .modules import MODULES, PLAIN_FLAG, Precision, parse_weight_flag, plain  # noqa: F401
from .checkpoint import MODELOPT_FILE, Quantization, read_quantization, read_scheme, resolve  # noqa: F401
