"""What to try, per finding rule and device kind: a CPU is never told to use CUDA graphs (pure).

``advice(rule, kind)`` is the action text of the rules whose advice depends on the device (``overhead-bound``,
``prefill-compute-bound``, ``cache-resident``, ``expert-bound``); "gpu" is also the advice for a device of
unknown kind.
"""

from __future__ import annotations

ADVICE = {   # (rule, device kind) -> what to try; "gpu" is also the advice for a device of unknown kind
    ("overhead-bound", "gpu"): "look at launches, synchronisation and small shapes: CUDA graphs, fused kernels, a "
                               "larger batch; more bandwidth or FLOP/s will not show",
    ("overhead-bound", "cpu"): "look at threads and call sizes: set the thread count to the physical cores "
                               "(torch.set_num_threads, OMP_NUM_THREADS; fewer threads for small shapes), pin the "
                               "OpenMP threads (OMP_PROC_BIND=close), a larger batch per call, bf16 only where the "
                               "CPU has fast paths for it (AMX, AVX512-BF16; else fp32); more bandwidth or FLOP/s "
                               "will not show",
    ("prefill-compute-bound", "gpu"): "more compute helps prefill (a faster GPU, tensor-core dtypes); reverse this "
                                      "if queueing or decode dominate what users wait for",
    ("prefill-compute-bound", "cpu"): "more compute helps prefill: all physical cores as threads "
                                      "(torch.set_num_threads), bf16 or int8 matmuls where the CPU has fast paths "
                                      "(AMX, AVX512-BF16/VNNI), or a GPU; reverse this if queueing or decode "
                                      "dominate what users wait for",
    ("cache-resident", "gpu"): "these steps ran from the L2, not HBM: profile the model and batch you will serve "
                               "(a working set past the L2 falls to the HBM roof) before trusting their times",
    ("cache-resident", "cpu"): "these steps ran from the CPU's cache, not DRAM: their times hold only while the "
                               "working set fits; profile the model and batch you will serve (a larger one falls "
                               "to the DRAM roof), and keep the thread count fixed (each core's cache is its own)",
    ("expert-bound", "gpu"): "expert parallelism (whole experts per GPU: each reads only its own experts' "
                             "weights, at the price of two all-to-alls per layer), or quantized experts (int8 / int4 "
                             "weights halve or quarter the expert bytes; check output quality)",
    ("expert-bound", "cpu"): "quantized experts (int8 / int4 weights halve or quarter the expert bytes; check output "
                             "quality); expert parallelism needs a second memory system (another socket or a GPU) to "
                             "spread the experts over",
}


def advice(rule: str, kind: str) -> str:
    """What to try for ``rule`` on a device of ``kind`` ("cpu" or "gpu")."""
    return ADVICE.get((rule, kind)) or ADVICE[(rule, "gpu")]
