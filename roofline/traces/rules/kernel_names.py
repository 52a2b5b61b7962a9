"""What a GPU kernel is by its name, for kernels no op explains (graph replays, kernels before the window).

Kernel-name rules (``registry.kernel_rule``): the first whose pattern is found in the lower-cased
name gives the kernel its category (``roofline.traces.graphs.kernel_category``); none: "other".
They register in this order, the more specific before the generic (communication before attention
before GEMM; reductions before copies, so Inductor's ``triton_red_fused__to_copy_...`` is a
reduction; the generic pointwise names last). A rule file that names kernels of its own gives them
a higher priority to be tried before these.
"""

from __future__ import annotations

from ..registry import kernel_rule

KERNEL_NAMES = dict((
        ("communication", r"nccl|rccl|cross_device_reduce|all_reduce|allreduce|all_gather|reduce_scatter"),
        ("attention", r"flash|fmha|attention|attn|mha_|flashinfer|xformers|paged_|unified_attention"),
        ("gemm", r"gemm|cutlass|cublas|xmma|sm\d\d_|cijk_|wvsplitk|hipblaslt|splitkreduce|gemv|nvjet|ampere_|"
                 r"hopper_|volta_|turing_|_mm_|matmul|dot_kernel"),
        ("norm", r"rms_?norm|layer_?norm"),
        ("activation", r"silu|act_and_mul|gelu|swiglu"),
        ("rope", r"rotary|rope"),
        ("kv_write", r"reshape_and_cache|cache_kernel|store_kv"),
        ("softmax", r"softmax"),
        ("reduction", r"reduce_kernel|triton_red|triton_per|reduction|argmax|topk|sort"),
        ("copy", r"copy|catarray|cat_|gather|scatter|index|transpose|permute"),
        ("elementwise", r"elementwise|triton_poi|fill|vectorized|unrolled|pointwise")))   # category -> pattern

for _category, _pattern in KERNEL_NAMES.items():
    kernel_rule(_category, _pattern)
