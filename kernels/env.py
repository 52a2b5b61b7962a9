"""Pick how Triton runs before it is imported: on a GPU natively, otherwise the interpreter.

``kernels/__init__.py`` imports this module first. If torch sees no CUDA device and the
user has not set ``TRITON_INTERPRET``, it sets ``TRITON_INTERPRET=1`` so every Triton kernel
runs on the CPU (serially, slowly: keep shapes tiny). Triton reads the variable once, at
import, so this must run before anything imports triton.
"""

from __future__ import annotations

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
