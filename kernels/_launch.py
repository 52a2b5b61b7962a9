"""Every Triton launch goes through ``launch``, so a launch can be recorded instead of run.

    launch(_linear_kernel, grid, x, w, y, M, N, K, ..., BLOCK_M=128, num_warps=8, num_stages=3)

Normally this is ``kernel[grid](*args, **kwargs)``. Inside ``recording(num_sms=132)`` nothing
runs: each launch is appended to the recorder as a ``Launch`` (the kernel, its grid, the
arguments exactly as the launcher passed them, the keyword constexprs and launch options), and
``_common.num_sms`` answers the fake SM count. With meta tensors (``device="meta"``) the
launchers then compute their block sizes, split counts and grids exactly as on a GPU of that
size, with no GPU and no memory: ``kernels.variants`` builds the compile check's variants from
these records, so a new block-size rule is covered without editing a list.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclass
class Launch:
    kernel: object            # the @triton.jit function (a JITFunction, or the interpreter's wrapper)
    grid: tuple               # (x, y, z), padded with 1s
    args: tuple               # positional arguments as passed (tensors, ints, floats)
    constexprs: dict          # keyword arguments that are kernel parameters
    options: dict             # num_warps, num_stages, ...
    context: dict = field(default_factory=dict)  # what the recorder was driving (model, phase, dtype, op, ...)

    @property
    def tag(self) -> str:
        """E.g. "llama-3-8b decode b=1 ctx=4096 bf16 q_proj"."""
        return " ".join(f"{k}={v}" if k in ("b", "ctx") else str(v) for k, v in self.context.items())

    @property
    def name(self) -> str:
        return kernel_name(self.kernel)

    @property
    def programs(self) -> int:
        x, y, z = self.grid
        return int(x) * int(y) * int(z)


@dataclass
class Recorder:
    num_sms: int
    launches: list = field(default_factory=list)
    context: dict = field(default_factory=dict)   # copied into each Launch

    def record(self, kernel, grid, args, kwargs):
        g = tuple(int(v) for v in (grid if isinstance(grid, (tuple, list)) else (grid,)))
        g = g + (1,) * (3 - len(g))
        opts = {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs}
        consts = {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
        self.launches.append(Launch(kernel, g, tuple(args), consts, opts, dict(self.context)))


_ACTIVE: list = []   # a stack of Recorders (innermost last)


def active_recorder() -> Recorder | None:
    return _ACTIVE[-1] if _ACTIVE else None


def sm_override() -> int | None:
    """The fake SM count of the innermost recording, or None when launches are real."""
    return _ACTIVE[-1].num_sms if _ACTIVE else None


@contextlib.contextmanager
def recording(num_sms: int):
    """Record launches instead of running them; ``num_sms(device)`` answers ``num_sms`` meanwhile."""
    if int(num_sms) < 1:
        raise ValueError(f"num_sms must be at least 1, got {num_sms}.")
    rec = Recorder(int(num_sms))
    _ACTIVE.append(rec)
    try:
        yield rec
    finally:
        _ACTIVE.remove(rec)


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, or a record of it inside ``recording``."""
    rec = active_recorder()
    if rec is not None:
        rec.record(kernel, grid, args, kwargs)
        return None
    return kernel[tuple(grid)](*args, **kwargs)


def kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", repr(kernel))
