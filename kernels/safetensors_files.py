"""The files of a checkpoint folder, read before a tensor is: which *.safetensors files, what their headers promise.

    files = weight_files(folder)          # checked: regular files, headers whole, no tensor in two files
    names, where = open_all(files)        # safetensors' handles: file name per handle, handle per tensor
    files_sha256(files)                   # for a result file's header (bounded by each file's size)
    nonfinite(files)                      # the first float tensor holding NaN / Inf, or None

A folder with ``model.safetensors.index.json`` (a sharded checkpoint) is read through its index: its weight_map
names each tensor's file, a file outside the folder or missing is refused by name, and a tensor the index puts in a
file that does not hold it is refused. Without an index every *.safetensors file of the folder is the checkpoint.

Every file is stat'ed before it is opened: only regular files are read (a folder, a FIFO or a symlink to /dev/zero
is refused, not read forever), and its header must account for the file exactly (8 + header length + the end of
the last tensor's data == the file's size), so nothing past what the header promises is ever read.
``parse_header`` / ``parse_index`` are the pure readers (bytes / parsed JSON in, ``Header`` / a dict out); anything
they refuse is a one-line ``RooflineError``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from roofline.errors import RooflineError

INDEX = "model.safetensors.index.json"
MAX_HEADER = 100_000_000          # safetensors' own limit on a header's length (bytes)
# Bits per element of each dtype safetensors writes.
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
              "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")      # what ``nonfinite`` scans (fp8 / fp4 hold codes, not values)


@dataclass(frozen=True)
class Entry:
    """One tensor of a header: its dtype, shape and [begin, end) within the data that follows the header."""
    dtype: str
    shape: tuple
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A safetensors header: its tensors by name, its __metadata__ and its length in bytes (after the 8 of the
    length itself)."""
    tensors: dict
    metadata: dict
    length: int


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header(data: bytes, size: int | None = None, where: str = "safetensors data") -> Header:
    """The header of a safetensors file whose first bytes are ``data`` and whose size is ``size`` (default
    len(data)); a one-line RooflineError naming ``where`` when the bytes are not one."""
    size = len(data) if size is None else size
    if size < 8 or len(data) < 8:
        raise RooflineError(f"{where} is {size} bytes, too short for a safetensors file (8 bytes of header length, "
                            "then the header): give the model's own *.safetensors files.")
    n = int.from_bytes(data[:8], "little")
    if n < 2 or n > MAX_HEADER or 8 + n > size:
        raise RooflineError(f"{where} is not a safetensors file: its first 8 bytes give a header of {n} bytes, "
                            f"{'past the file' if 8 + n > size else 'out of range'} ({size} bytes; a header is 2 "
                            f"to {MAX_HEADER:,} bytes): the file is damaged or of another kind.")
    if len(data) < 8 + n:
        raise RooflineError(f"{where}: {len(data)} bytes were given of a header that ends at byte {8 + n}.")
    try:
        d = json.loads(data[8:8 + n].decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RooflineError(f"{where} is not a safetensors file: its {n}-byte header is not JSON "
                            f"({type(e).__name__}): the file is damaged or of another kind.") from None
    if not isinstance(d, dict):
        raise RooflineError(f"{where} is not a safetensors file: its header is not a JSON object.")
    meta = d.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise RooflineError(f"{where}: its header's __metadata__ must map strings to strings.")
    tensors = {name: _entry(where, name, e) for name, e in d.items()}
    end = 0
    for name, e in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin != end:
            raise RooflineError(f"{where}: tensor {name!r} starts at data byte {e.begin} where the one before it "
                                f"ends at {end} (a safetensors file's tensors lie end to end): the file is damaged.")
        end = e.end
    if 8 + n + end != size:
        raise RooflineError(f"{where} is {size:,} bytes where its header promises {8 + n + end:,} (8 + a {n}-byte "
                            f"header + {end:,} bytes of tensors): the file is truncated, padded or not a "
                            "safetensors file.")
    return Header(tensors, dict(meta), n)


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _entry(where: str, name: str, e) -> Entry:
    bad = lambda why: RooflineError(f"{where}: tensor {name!r} {why} in its header: the file is damaged.")  # noqa: E731
    if not isinstance(e, dict):
        raise bad("is not an object")
    dtype, shape, off = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise bad(f"has dtype {str(dtype)[:20]!r}, none safetensors writes ({', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise bad("has a shape that is not a list of sizes")
    if not (isinstance(off, list) and len(off) == 2 and all(_is_int(o) for o in off) and 0 <= off[0] <= off[1]):
        raise bad("has data_offsets that are not [begin, end] with 0 <= begin <= end")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != off[1] - off[0]:
        raise bad(f"({dtype} {shape}) spans {off[1] - off[0]} bytes where its shape needs {bits / 8:g}")
    return Entry(dtype, tuple(shape), off[0], off[1])


def _regular(path: Path, what: str) -> int:
    """The size of ``path`` when it is a regular file (a symlink to one counts), else a one-line RooflineError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RooflineError(f"{what} {path} does not exist{' (a broken symlink)' if path.is_symlink() else ''}: "
                            "give the checkpoint folder as saved.") from None
    except OSError as e:
        raise RooflineError(f"{what} {path} cannot be read ({e.strerror or e}).") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "a pipe" if stat.S_ISFIFO(st.st_mode) else "not a regular file")
        raise RooflineError(f"{what} {path} is {kind}, not a file of tensors: remove it or give the folder the "
                            "model was saved to.")
    return st.st_size


def read_header(path) -> Header:
    """The header of the safetensors file ``path``: a regular file, read no further than its header."""
    p = Path(path)
    size = _regular(p, "checkpoint file")
    where = f"checkpoint file {p}"
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            if 2 <= n <= min(MAX_HEADER, size - 8):
                head += fh.read(n)
    except OSError as e:
        raise RooflineError(f"{where} cannot be read ({e.strerror or e}).") from None
    return parse_header(head, size, where)


def parse_index(d, where: str = INDEX) -> dict:
    """A sharded checkpoint's index (parsed JSON) -> {tensor name: file name}, each file a path inside the folder."""
    if not isinstance(d, dict) or not isinstance(d.get("weight_map"), dict):
        raise RooflineError(f"{where} must be a JSON object with a \"weight_map\" object (tensor name -> file), as "
                            "save_pretrained writes it.")
    out = {}
    for name, f in d["weight_map"].items():
        if not isinstance(f, str) or not f:
            raise RooflineError(f"{where}: tensor {name!r} maps to {json.dumps(f)[:40]}, not a file name.")
        p = PurePosixPath(f)
        if p.is_absolute() or ".." in p.parts or "\\" in f or "\x00" in f or not p.name.endswith(".safetensors"):
            raise RooflineError(f"{where}: tensor {name!r} is in {f[:80]!r}, which is not a *.safetensors file inside "
                                "the checkpoint folder: the index may name only the folder's own files.")
        out[name] = f
    if not out:
        raise RooflineError(f"{where}: its weight_map names no tensor.")
    return out


def read_index(folder) -> dict | None:
    """The folder's index ({tensor: file name}) when it has one, else None."""
    p = Path(folder) / INDEX
    if not os.path.lexists(p):
        return None
    from roofline.config_fields import read_json_file

    _regular(p, "checkpoint index")
    return parse_index(read_json_file(p, "checkpoint index"), f"checkpoint index {p}")


def weight_files(folder) -> list[Path]:
    """The checkpoint's *.safetensors files (the index's, else the folder's; sorted), [] when it holds none; every one
    a regular file whose header accounts for it, no tensor in two of them (one-line RooflineErrors otherwise)."""
    return list(checked(folder)[0])


def checked(folder) -> tuple:
    """(files, {tensor: file}) of a checkpoint folder, checked as ``weight_files`` says."""
    p = Path(folder)
    if not p.is_dir():
        return (), {}
    index = read_index(p)
    if index is None:
        files = sorted(p.glob("*.safetensors"))
    else:
        files = sorted({p / f for f in index.values()})
        for f in files:
            if not os.path.lexists(f):
                users = sorted(k for k, v in index.items() if p / v == f)
                raise RooflineError(f"checkpoint index {p / INDEX} puts {len(users)} tensors ({users[0]}, ...) in "
                                    f"{f.relative_to(p)}, which the folder lacks: download the missing shard.")
    where: dict = {}
    for f in files:
        for name in read_header(f).tensors:
            if name in where:
                raise RooflineError(f"checkpoint {p}: tensor {name!r} is in both {where[name].name} and {f.name}: "
                                    "remove the stale file (a checkpoint holds each tensor once).")
            where[name] = f
    if index is not None:
        wrong = next(((k, v) for k, v in index.items() if where.get(k) != p / v), None)
        if wrong:
            k, v = wrong
            held = f"is in {where[k].name}" if k in where else "is in none of its files"
            raise RooflineError(f"checkpoint index {p / INDEX} puts tensor {k!r} in {v}, but it {held}: the index "
                                "and the shards do not belong together.")
    return tuple(files), where


def files_sha256(files) -> str:
    """sha256 over the files' contents, in order (16 MiB reads, each file no further than its size)."""
    h = hashlib.sha256()
    for f in files:
        left = _regular(Path(f), "checkpoint file")
        with open(f, "rb") as fh:
            while left > 0:
                block = fh.read(min(1 << 24, left))
                if not block:
                    break
                h.update(block)
                left -= len(block)
    return h.hexdigest()


def open_all(files):
    """safetensors' handles of ``files``: ({id(handle): file name}, {tensor name: handle})."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise RooflineError("loading *.safetensors needs the safetensors package: pip install safetensors "
                            "(or give a folder with only config.json for random weights).") from None
    where, names = {}, {}
    for f in files:
        try:
            h = safe_open(str(f), framework="pt")
        except Exception as e:   # a damaged or foreign file: name it
            raise RooflineError(f"checkpoint file {f} cannot be read as safetensors ({e}): give the model's "
                                "own *.safetensors files.") from None
        names[id(h)] = f.name
        for k in h.keys():
            where[k] = h
    return names, where


def nonfinite(files):
    """(tensor name, file name, NaN count, Inf count) of the first float tensor holding a NaN or an Inf, else None."""
    import torch

    names, where = open_all(files)
    dtypes = {k: e.dtype for f in files for k, e in read_header(f).tensors.items()}
    for name in sorted(where):
        if dtypes.get(name) not in FLOAT_DTYPES:
            continue
        h = where[name]
        t = h.get_tensor(name)
        if not bool(torch.isfinite(t).all()):
            return name, names[id(h)], int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return None
