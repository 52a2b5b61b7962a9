"""Element sizes of the data types the cost model knows.

Weights, activations and the KV cache each carry their own dtype, so int4 weights with
bf16 activations, or an fp8 KV cache, are costed with the right bytes per element.
"""

from .errors import RooflineError

# Bytes per element. int4 packs two values per byte.
BYTES_PER_ELEMENT = {
    "fp32": 4.0,
    "tf32": 4.0,  # stored as fp32; only the tensor-core math is reduced precision
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "float8": "fp8", "fp8_e4m3": "fp8", "e4m3": "fp8", "float8_e4m3fn": "fp8",
    "i8": "int8", "i4": "int4",
}


def normalize_dtype(name: str) -> str:
    """Map a user-written dtype ("bfloat16", "BF16", "torch.float16") to our key."""
    key = str(name).strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in BYTES_PER_ELEMENT:
        allowed = ", ".join(BYTES_PER_ELEMENT)
        raise RooflineError(f"Unknown dtype {name!r}: choose one of {allowed}.")
    return key


# Storage-only types a profiler trace records (index tensors, masks, fp64 scalars): their element
# sizes for byte counts. They are never a compute dtype, so ``normalize_dtype`` (user input) refuses them.
STORAGE_BYTES = {"fp64": 8.0, "int64": 8.0, "int32": 4.0, "int16": 2.0, "uint8": 1.0, "bool": 1.0}


def bytes_per_element(name: str) -> float:
    """Bytes per element of a compute dtype, or of a storage-only type (``STORAGE_BYTES``)."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key in STORAGE_BYTES:
        return STORAGE_BYTES[key]
    return BYTES_PER_ELEMENT[normalize_dtype(name)]
