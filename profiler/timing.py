"""All timing lives here (DESIGN.md "Timing"): clocks, synchronisation, repeated timing.

Only this module reads a clock. Every timestamp is taken after a device sync, so a
time on the GPU means work finished, not work queued.
"""

from __future__ import annotations

import time


def synchronize(device=None) -> None:
    """Wait for queued device work (a no-op on the CPU)."""
    import torch

    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def timestamp(device=None) -> float:
    """Monotonic seconds, taken after the device has finished all queued work."""
    synchronize(device)
    return time.perf_counter()
