"""The one writer of result files: exclusive, append-only, repaired before it appends, never silently replacing.

    w = ResultWriter(path, mode="new" | "resume" | "overwrite")   # takes the lock; checks the mode
    ...                                                          # measure ceilings, build the header
    w.begin(header)                                              # resume: compare; else write the header
    w.write(record)                                              # one flushed line per record
    w.close()

Rules (each one a way results were lost before):

* **One writer per file.** The file is opened without truncation and locked with an
  exclusive ``flock`` for the whole run. A second run on the same file stops at once with
  the process that holds it (from /proc/locks): two runs never interleave lines.
* **An existing file is never replaced silently.** ``mode="new"`` refuses a file that holds
  records; ``"overwrite"`` truncates it (after the lock is held); ``"resume"`` appends.
* **Resume repairs first.** A run killed mid-write leaves a torn last line: it is cut off
  (``repaired_bytes`` says how much) before anything is appended, so the file stays
  readable. The file's header must match the new run's: the full model config, dtypes,
  device and every setting that changes a measurement (``resume_mismatch`` names the field).
* **Lines are strict JSON**, written with one ``os.write`` each and flushed to the OS.

Readers (``roofline.records.read_results``) need no lock.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

from .errors import RooflineError
from .records import RunHeader, json_line, read_results

MODES = ("new", "resume", "overwrite")
# settings that change what a measurement means: a resumed run must match them
MEASUREMENT_SETTINGS = ("device", "threads", "cpu_flush_bytes", "budget_s", "warmup_s", "flush_cache",
                        # latency runs: the workload every configuration serves
                        "backend", "torch_device", "prompt_tokens", "output_tokens", "requests", "rate", "arrival",
                        "seed", "shared_prefix", "block_size", "max_slots", "slo", "tp")


class ResultWriter:
    """Appends records to a JSON Lines file it holds an exclusive lock on; see the module docstring.

    ``ResultWriter(path, header)`` (the old two-argument form) begins at once in mode "new"
    when the file is empty or missing, else raises; pass ``mode`` for the others.
    """

    def __init__(self, path, header: RunHeader | None = None, *, mode: str = "new", resume: bool = False):
        if resume:
            mode = "resume"
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.path = Path(path)
        self.mode = mode
        self.done: set = set()        # keys of points already in the file (resume)
        self.old = None               # the ResultFile found there (resume)
        self.repaired_bytes = 0       # torn tail cut off before appending
        self.written = 0
        self._fd = None
        self._created = False         # this writer made the file: an empty one is removed again on close
        self._open()
        if header is not None:
            self.begin(header)

    # ---- opening: lock, then decide what the existing content means
    def _open(self):
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_dir():
                raise RooflineError(f"{self.path} is a folder; the results file needs that name. Remove or "
                                    "rename the folder, or give another --out.")
            self._created = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise RooflineError(f"cannot write results file {self.path}: {e.strerror or e}. Give another --out."
                                ) from None
        _lock(fd, self.path)
        self._fd = fd
        size = os.fstat(fd).st_size
        try:
            if self.mode == "new" and size > 0:
                raise RooflineError(f"{self.path} already holds results. Add --resume to continue it, or "
                                    "--overwrite to replace it (its measurements are lost), or give another --out.")
            if self.mode == "resume" and size > 0:
                self.repaired_bytes = _cut_torn_tail(fd)
                if os.fstat(fd).st_size > 0:
                    self.old = read_results(self.path)
                    self.done = {m.point.key for m in self.old.measurements}
        except BaseException:
            self.close()
            raise

    def check(self, header: RunHeader) -> None:
        """RooflineError when ``header``'s run may not append to the file found (resume only)."""
        if self.old is not None:
            diff = resume_mismatch(self.old.header, header)
            if diff:
                raise RooflineError(f"cannot resume {self.path}: {diff}. Use another --out, or --overwrite to start "
                                    "over.")

    def begin(self, header: RunHeader) -> None:
        """Start writing: after a resume check, or with a fresh header line."""
        if self.old is not None:
            self.check(header)
            return
        os.ftruncate(self._fd, 0)
        self._line(header.to_dict())

    def _line(self, d: dict) -> None:
        data = json_line(d).encode()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def write(self, record) -> None:
        d = record.to_dict() if hasattr(record, "to_dict") else record
        self._line(d)
        self.written += 1
        point = getattr(record, "point", None)
        if point is not None:
            self.done.add(point.key)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError:  # pragma: no cover - e.g. a pipe or a filesystem without fsync
                pass
            if self._created and os.fstat(self._fd).st_size == 0:
                try:
                    self.path.unlink()   # nothing was begun (a check failed first): leave no empty file
                except OSError:
                    pass
            os.close(self._fd)   # closing releases the flock
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cut_torn_tail(fd) -> int:
    """Truncate after the last newline; returns the bytes dropped (a line cut off mid-write)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    pos, chunk = size, 1 << 16
    while pos > 0:
        start = max(0, pos - chunk)
        data = os.pread(fd, pos - start, start)
        i = data.rfind(b"\n")
        if i >= 0:
            keep = start + i + 1
            break
        pos = start
    else:
        keep = 0
    if keep < size:
        os.ftruncate(fd, keep)
    return size - keep


def _lock(fd, path: Path) -> None:
    if fcntl is None:  # pragma: no cover - Windows: no advisory locks; one run at a time is on the user
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RooflineError(f"{path} is being written by another roofline run ({lock_holder(path)}). Wait for it "
                            "to finish, or give this run another --out.") from None


def lock_holder(path: Path) -> str:
    """'pid 1234: roofline profile ...' for the process holding a flock on ``path`` (Linux), else a vague answer."""
    try:
        st = os.stat(path)
        want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].lower() == want.lower():
                pid = int(parts[4])
                if pid == os.getpid():
                    return f"pid {pid}: this process"
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                except OSError:
                    cmd = ""
                return f"pid {pid}" + (f": {cmd[:160]}" if cmd else "")
    except (OSError, ValueError):
        pass
    return "another process"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_mismatch(old: RunHeader, new: RunHeader) -> str:
    """Why ``new`` may not append to a file started with ``old``; "" when it may.

    Compared: kind, the full model config (every field), the dtype, the device name, the checkpoint's sha256
    (``weights.sha256``) and the settings in ``MEASUREMENT_SETTINGS`` that both headers record.
    """
    if old.kind != new.kind:
        return f"it holds a {old.kind} run, this is a {new.kind} run"
    if (old.model is None) != (new.model is None):
        return "one of the two runs has no model"
    if old.model is not None:
        a, b = old.model.to_dict(), new.model.to_dict()
        for k in a:
            if k != "notes" and a.get(k) != b.get(k):
                return f"it holds model {k} = {a.get(k)!r}, this run has {b.get(k)!r}"
    if old.dtype != new.dtype:
        return f"it holds dtype {old.dtype!r}, this run is {new.dtype!r}"
    if old.device.name != new.device.name:
        return f"it holds device {old.device.name!r}, this run is on {new.device.name!r}"
    a, b = _flat(old.settings), _flat(new.settings)
    was, now = a.get("weights.sha256"), b.get("weights.sha256")
    if was and now and was != now:     # the same folder, other weights: the old points timed other tensors
        return (f"the checkpoint's weights changed since it was measured (sha256 {was[:12]}... then, {now[:12]}... "
                "now)")
    for k in MEASUREMENT_SETTINGS:
        keys = [x for x in a if x == k or x.startswith(k + ".")]
        for x in keys:
            if x in b and a[x] != b[x]:
                return f"it was measured with {x} = {a[x]!r}, this run has {b[x]!r}"
    return ""

