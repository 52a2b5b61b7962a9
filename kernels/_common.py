"""Helpers shared by the kernel launchers: dtype names, input checks, launch sizing.

Every launcher checks its inputs in one place (``check_tensor``) and raises ValueError naming
the tensor, the expected and the received shape or dtype.
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from roofline.dtypes import normalize_dtype
from roofline.errors import RooflineError

from .env import HAS_CUDA, INTERPRET  # noqa: F401
from ._launch import sm_override

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
FLOAT_DTYPES = tuple(TORCH_DTYPES.values())


def torch_dtype(name) -> torch.dtype:
    """A torch dtype the kernels run (fp32, fp16, bf16) from a torch dtype or any name
    ``roofline.dtypes.normalize_dtype`` knows ("bfloat16", "BF16", "torch.float16", ...)."""
    if isinstance(name, torch.dtype):
        if name not in DTYPE_NAMES:
            raise ValueError(f"dtype {name} is not supported by the kernels: use one of {', '.join(TORCH_DTYPES)}.")
        return name
    key = normalize_dtype(name)  # RooflineError (a ValueError) listing the names it knows
    if key not in TORCH_DTYPES:
        raise RooflineError(f"dtype {name!r} is not supported by the kernels ({key} is costed, not run): "
                            f"use one of {', '.join(TORCH_DTYPES)}.")
    return TORCH_DTYPES[key]


def dtype_name(dt: torch.dtype) -> str:
    return DTYPE_NAMES[dt]


def check_tensor(name: str, t, shape=None, dtype=None, *, dtypes=None, device=None, contiguous_last=True):
    """Raise ValueError naming ``name`` if ``t`` is not a tensor of ``shape`` / dtype.

    ``shape`` entries may be None (any size). ``dtypes`` is a tuple of allowed dtypes.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
    if shape is not None:
        ok = t.dim() == len(shape) and all(s is None or s == r for s, r in zip(shape, t.shape))
        if not ok:
            exp = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {exp}, got {list(t.shape)}.")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {t.dtype}.")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name} must have a dtype in {[str(d) for d in dtypes]}, got {t.dtype}.")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}.")
    if contiguous_last and t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride()}).")
    return t


@triton.jit
def tanh(x):
    """tanh of an fp32 tensor from exp2 (the interpreter has no libdevice tanh): sign(x) (1 - e) / (1 + e),
    e = exp(-2|x|) in (0, 1], so it never overflows; |error| ~ 1e-7 near 0, exactly +-1 far out. Used by
    softcapped attention scores and gelu-tanh (a launched kernel must call it by name: the compile check's
    reach rule)."""
    e = tl.math.exp2(-2.8853900817779268 * tl.abs(x))     # 2 log2(e) |x|
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


def check_window(window, softcap) -> tuple:
    """(window as an int or None, softcap as a float or None): window a whole number >= 1, softcap > 0."""
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) and not (hasattr(window, "__index__")):
            raise ValueError(f"window must be a whole number of keys of at least 1 (or None), got {window!r}.")
        window = int(window)
        if window < 1:
            raise ValueError(f"window must be a whole number of keys of at least 1 (or None), got {window}.")
    if softcap is not None:
        softcap = float(softcap)
        if not softcap > 0 or softcap == float("inf"):
            raise ValueError(f"softcap must be a finite number above 0 (or None: no softcapping), got {softcap}.")
    return window, softcap


def num_sms(device) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H100 SXM); 4 under the interpreter.

    Inside ``_launch.recording(num_sms=...)`` (the compile check's variant discovery) the fake count.
    """
    fake = sm_override()
    if fake is not None:
        return fake
    if HAS_CUDA and torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def take(t: torch.Tensor, idx) -> torch.Tensor:
    """``t[idx]`` for any dtype: an fp8 tensor is indexed through its uint8 view (torch's gather and scatter
    kernels do not take every float8 dtype on every device); values are the same bits."""
    if t.dtype.is_floating_point and t.element_size() == 1:
        return t.view(torch.uint8)[idx].view(t.dtype)
    return t[idx]


def put(t: torch.Tensor, idx, value: torch.Tensor) -> None:
    """``t[idx] = value`` for any dtype (fp8 through uint8 views, as ``take``)."""
    if t.dtype.is_floating_point and t.element_size() == 1:
        t.view(torch.uint8)[idx] = value.to(t.dtype).view(torch.uint8)
    else:
        t[idx] = value


_IDENTITY: dict = {}   # id(slots) -> (weakref to it, its _version, whether it is 0..B-1)


def slot_rows(cache: torch.Tensor, slots: torch.Tensor, n: int) -> torch.Tensor:
    """cache[slots, :, :n] ([B, H, n, D]) for the torch peers: a view, not a copy, when slots are 0..B-1.

    Whether ``slots`` is 0..B-1 is learned once per tensor (one device sync, in the untimed first
    call) and remembered until the tensor is written in place (its ``_version`` changes); any other
    slot set is gathered (a copy).
    """
    B = slots.shape[0]
    seen = _IDENTITY.get(id(slots))
    if seen is None or seen[0]() is not slots or seen[1] != slots._version:
        ident = B <= cache.shape[0] and bool(torch.equal(slots, torch.arange(B, device=slots.device,
                                                                              dtype=slots.dtype)))
        if len(_IDENTITY) > 4096:
            _IDENTITY.clear()
        seen = _IDENTITY[id(slots)] = (weakref.ref(slots), slots._version, ident)
    return cache[:B, :, :n] if seen[2] else take(cache, (slots, slice(None), slice(None, n)))
