"""Pick how Triton runs before it is imported: on a GPU natively, otherwise the interpreter.

``kernels/__init__.py`` imports this module first. If torch sees no CUDA device and the
user has not set ``TRITON_INTERPRET``, it sets ``TRITON_INTERPRET=1`` so every Triton kernel
runs on the CPU (serially, slowly: keep shapes tiny). Triton reads the variable once, at
import, so this must run before anything imports triton.
"""

from __future__ import annotations

import os

import torch

from roofline.precision.formats import native_computes

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


FP8_CAPABILITY = native_computes()["fp8"]   # the registry's: (8, 9), Ada and Hopper, the first with fp8 e4m3
FP8_SM = 10 * FP8_CAPABILITY[0] + FP8_CAPABILITY[1]   # the same as a compile target's capability number: 89


def fp8_supported(device) -> bool:
    dev = torch.device(device)
    if dev.type == "meta":
        return True                     # the compile check: the target decides (kernels.variants)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(dev) >= FP8_CAPABILITY


def device_label(device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(dev)} (sm_{''.join(map(str, torch.cuda.get_device_capability(dev)))})"
    return "the CPU (the Triton interpreter cannot run fp8)" if dev.type == "cpu" else str(dev)
