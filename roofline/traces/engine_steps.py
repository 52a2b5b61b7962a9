"""Serving engines' steps as their step annotations say them, and the mix of work each step ran.

A serving engine runs one *step* per scheduler iteration: some prefill chunks (each a run of new tokens after a
cached prefix) and some decode sequences (one new token over its own context), together in one forward when it
batches continuously. The engines name each step in a ``record_function`` range; the formats read here are the
engines' own, from their sources:

* vLLM V1, ``Worker.annotate_profile`` (``vllm/v1/worker/gpu_worker.py``):
  ``execute_context_{num_ctx_requests}({num_ctx_tokens})_generation_{num_generation_requests}({num_generation_tokens})``
  (recent versions, as quoted from that method and as recorded in published vLLM traces), and
  ``execute_new_{num_new}_cached_{num_cached}`` (as read in commit 35d5cda1's source: new and cached request
  counts only, which do not tell a continuing chunk from a decode).
* SGLang, ``build_step_span_name`` (``python/sglang/srt/utils/profile_utils.py``, commit 01144484):
  ``step[EXTEND bs={batch_size} toks={extend_num_tokens}]`` and ``step[{ForwardMode.name} bs={batch_size}]``
  (DECODE, MIXED, IDLE, TARGET_VERIFY, ...).

Neither says the KV lengths (each chunk's cached prefix, each decode sequence's context): those are tensor
values. They come from a *mix* the user gives in ``explain --mix``'s syntax (``prefill=1x512@1536,decode=31x2048``:
one 512-token chunk after 1,536 cached tokens, 31 sequences each attending over 2,048 keys, their new one
included), applied to each step whose annotated counts agree with it; a step that disagrees keeps its counts and
no lengths (its attention stays uncosted) and is said so. With no step annotation at all, a given mix is the
trace's one step.

``StepMix.attention`` costs one attention layer of a mix by ``roofline.formulas`` (each chunk's attention over
its prefix, causal; each decode group over its own context; a layer's sliding window caps both), and
``StepMix.mla_attention`` the same for latent attention; the linears' tokens are the step's ``tokens``.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field, replace

from .. import formulas as F
from ..errors import RooflineError

MIX_HELP = ("a mix is prefill=NxQ[@C] and decode=NxC items separated by commas, e.g. "
            "prefill=1x512@1536,decode=31x2048 (N sequences, Q new tokens after C cached; decode over C keys)")


@dataclass(frozen=True)
class StepMix:
    """One step's work: ``chunks`` ((new tokens, cached tokens) per prefill chunk) and ``decodes`` ((sequences,
    keys each attends over, its new one included) per group)."""

    chunks: tuple = ()
    decodes: tuple = ()

    @property
    def prefill_tokens(self) -> int:
        return sum(q for q, _ in self.chunks)

    @property
    def decode_sequences(self) -> int:
        return sum(n for n, _ in self.decodes)

    @property
    def tokens(self) -> int:
        """The tokens every linear of the step runs on: the chunks' new tokens and one per decode sequence."""
        return self.prefill_tokens + self.decode_sequences

    def text(self) -> str:
        parts = [f"prefill=1x{q}@{c}" if c else f"prefill=1x{q}" for q, c in self.chunks]
        return ",".join(parts + [f"decode={n}x{c}" for n, c in self.decodes])

    def attention(self, n_heads: int, n_kv_heads: int, head_dim: int, *, window: int = 0, act_dtype: str = "bf16",
                  kv_dtype: str = "bf16", kv_scales: bool = False):
        """One layer's attention over the whole mix (``formulas.prefill_attention`` causal per chunk,
        ``formulas.decode_attention`` per decode group), under ``window`` keys (0: none)."""
        w = window or None
        kw = dict(act_dtype=act_dtype, kv_dtype=kv_dtype, kv_scales=kv_scales)
        total = None
        for q, c in self.chunks:
            x = F.prefill_attention(1, q, n_heads, n_kv_heads, head_dim, cached_tokens=c, causal=True, window=w, **kw)
            total = x if total is None else total + x
        for n, c in self.decodes:
            x = F.decode_attention(n, c, n_heads, n_kv_heads, head_dim, window=w, **kw)
            total = x if total is None else total + x
        return total

    def mla_attention(self, n_heads: int, kv_lora_rank: int, rope_dim: int, *, act_dtype: str = "bf16",
                      kv_dtype: str = "bf16"):
        """Absorbed latent attention of the mix's decode groups (``formulas.mla_decode_attention``); None when
        the mix has prefill chunks (an MLA decode kernel runs decodes only)."""
        if self.chunks or not self.decodes:
            return None
        total = None
        for n, c in self.decodes:
            x = F.mla_decode_attention(n, c, n_heads, kv_lora_rank, rope_dim, act_dtype=act_dtype, kv_dtype=kv_dtype)
            total = x if total is None else total + x
        return total


def parse_mix(spec) -> StepMix:
    """``"prefill=1x512@1536,decode=31x2048"`` -> ``StepMix``; anything else refused in one line."""
    chunks, decodes = [], []
    for item in str(spec).split(","):
        kind, sep, val = item.strip().partition("=")
        m = re.fullmatch(r"(\d+)x(\d+)(?:@(\d+))?", val.strip())
        kind = kind.strip().lower()
        if not sep or m is None or kind not in ("prefill", "decode") or (kind == "decode" and m.group(3)):
            raise RooflineError(f"--mix: {item.strip()!r} is not a mix item: {MIX_HELP}.")
        n, x = int(m.group(1)), int(m.group(2))
        if n < 1 or x < 1:
            raise RooflineError(f"--mix: {item.strip()!r} needs at least 1 sequence of at least 1 token: {MIX_HELP}.")
        if kind == "prefill":
            chunks += [(x, int(m.group(3) or 0))] * n
        else:
            decodes.append((n, x))
    return StepMix(tuple(chunks), tuple(decodes))


@dataclass(frozen=True)
class EngineStep:
    """One annotated step: what its annotation says (None: not said), and the mix applied to it."""

    engine: str
    name: str
    ts: float
    end: float
    pid: object
    mode: str                          # "prefill", "decode", "mixed", "idle"
    prefill_requests: int | None = None
    prefill_tokens: int | None = None
    decode_requests: int | None = None
    decode_tokens: int | None = None
    mix: StepMix | None = None
    how: str = ""

    @property
    def tokens(self) -> int | None:
        """Tokens the step's linears run on: the mix's, else the annotation's when it says both parts."""
        if self.mix is not None:
            return self.mix.tokens
        if self.prefill_tokens is not None and self.decode_tokens is not None:
            return self.prefill_tokens + self.decode_tokens
        return None

    @property
    def key(self) -> tuple:
        return (self.mode, self.prefill_tokens, self.decode_tokens, self.mix)

    def agrees(self, mix: StepMix) -> bool:
        """Whether ``mix`` has the counts the annotation says (each one it says)."""
        said = ((self.prefill_requests, len(mix.chunks)), (self.prefill_tokens, mix.prefill_tokens),
                (self.decode_requests, mix.decode_sequences), (self.decode_tokens, mix.decode_sequences))
        return all(a is None or a == b for a, b in said)

    def to_json(self) -> dict:
        return {"engine": self.engine, "name": self.name, "mode": self.mode, "ts_us": self.ts,
                "time_s": (self.end - self.ts) * 1e-6, "prefill_requests": self.prefill_requests,
                "prefill_tokens": self.prefill_tokens, "decode_requests": self.decode_requests,
                "decode_tokens": self.decode_tokens, "mix": self.mix.text() if self.mix else None, "how": self.how}


def _mode(prefill, decode) -> str:
    if prefill and decode:
        return "mixed"
    return "prefill" if prefill else "decode" if decode else "idle"


def _vllm_context_generation(m) -> dict:
    pr, pt, dr, dt = (int(m.group(i)) for i in range(1, 5))
    return {"mode": _mode(pr, dr), "prefill_requests": pr, "prefill_tokens": pt, "decode_requests": dr,
            "decode_tokens": dt}


def _vllm_new_cached(m) -> dict:
    new, cached = int(m.group(1)), int(m.group(2))      # a cached request may continue a chunk or decode
    return {"mode": "prefill" if new and not cached else "decode" if cached and not new else
            "mixed" if new else "idle", "prefill_requests": new if not cached else None}


_SGLANG_MODES = {"EXTEND": "prefill", "PREFILL": "prefill", "DECODE": "decode", "MIXED": "mixed", "IDLE": "idle",
                 "TARGET_VERIFY": "decode", "DRAFT_EXTEND": "prefill", "DRAFT_EXTEND_V2": "prefill",
                 "SPLIT_PREFILL": "prefill", "DLLM_EXTEND": "prefill"}


def _sglang_step(m) -> dict:
    name, bs, toks = m.group(1), int(m.group(2)), m.group(3)
    mode = _SGLANG_MODES.get(name, "mixed")
    out = {"mode": mode}
    if mode == "prefill":
        out.update(prefill_requests=bs, prefill_tokens=int(toks) if toks else None, decode_requests=0,
                   decode_tokens=0)
    elif name == "DECODE":
        out.update(prefill_requests=0, prefill_tokens=0, decode_requests=bs, decode_tokens=bs)
    return out


# (engine, regular expression matched against the whole annotation name, what it says): a registry, tried in order
ANNOTATIONS = [
    ("vllm", re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)"), _vllm_context_generation),
    ("vllm", re.compile(r"execute_new_(\d+)_cached_(\d+)"), _vllm_new_cached),
    ("sglang", re.compile(r"step\[([A-Z_0-9]+) bs=(\d+)(?: toks=(\d+))?\]"), _sglang_step),
]


def parse_annotation(name: str) -> tuple | None:
    """(engine, what the name says) for an engine's step annotation, or None."""
    for engine, rx, read in ANNOTATIONS:
        m = rx.fullmatch(name.strip())
        if m is not None:
            return engine, read(m)
    return None


@dataclass
class EngineSteps:
    """A trace's engine steps in time order, and where each instant falls (``at``)."""

    steps: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    _starts: list = field(default_factory=list)
    _longest: float = 0.0

    def at(self, t: float, pid=None) -> EngineStep | None:
        """The latest-starting step that contains ``t`` (µs) on process ``pid`` (any process when None)."""
        j = bisect.bisect_right(self._starts, t) - 1
        while j >= 0:
            s = self.steps[j]
            if s.ts <= t <= s.end and (pid is None or s.pid is None or s.pid == pid):
                return s
            j -= 1
            if j >= 0 and t - self.steps[j].ts > self._longest:
                break
        return None

    def measure(self, instances) -> dict:
        """Per step (by index): GPU seconds of the instances launched in it, the uncosted ones, and the rows its
        GEMMs ran (the most common ``m``: under a CUDA graph the captured size, which may pad the step's tokens)."""
        from collections import Counter
        out: dict = {}
        index = {id(s): n for n, s in enumerate(self.steps)}
        for i in instances:
            s = self.at(i.t, i.thread[0] if i.thread else None)
            if s is None:
                continue
            m = out.setdefault(index[id(s)], {"gpu_s": 0.0, "uncosted_s": 0.0, "rows": Counter()})
            m["gpu_s"] += i.seconds
            if i.off == "uncosted":
                m["uncosted_s"] += i.seconds
            if i.category == "gemm" and i.detail.get("m"):
                m["rows"][i.detail["m"]] += 1
        return out

    def to_json(self, instances=()) -> dict:
        """The steps (the first 64), each with its GPU time, costed share and the rows its linears ran, the
        steps grouped by shape, and what CUDA-graph padding wasted."""
        measured = self.measure(instances)
        steps, groups, padded = [], {}, []
        for n, s in enumerate(self.steps):
            d = s.to_json()
            m = measured.get(n)
            if m is not None:
                rows = m["rows"].most_common(1)[0][0] if m["rows"] else None
                d.update(gpu_s=m["gpu_s"], costed_share=1 - m["uncosted_s"] / m["gpu_s"] if m["gpu_s"] else None,
                         gemm_rows=rows)
                if rows and s.tokens and rows > s.tokens:
                    d["padding_tokens"] = rows - s.tokens
                    padded.append((rows, s.tokens))
            if n < 64:
                steps.append(d)
            g = groups.setdefault((s.mode, s.prefill_tokens, s.decode_tokens, s.mix.text() if s.mix else None),
                                  {"mode": s.mode, "prefill_tokens": s.prefill_tokens, "decode_tokens": s.decode_tokens,
                                   "mix": s.mix.text() if s.mix else None, "steps": 0, "gpu_s": 0.0})
            g["steps"] += 1
            g["gpu_s"] += d.get("gpu_s", 0.0)
        notes = list(self.notes)
        if padded:
            rows, toks = padded[0]
            notes.append(f"CUDA-graph padding: {len(padded)} step(s) ran their linears on more rows than their tokens "
                         f"(e.g. {toks} tokens as the captured {rows}): {rows - toks} of {rows} rows' GEMM work "
                         "wasted.")
        return {"count": len(self.steps), "steps": steps, "groups": list(groups.values()), "notes": notes}


def find_steps(trace, mix: StepMix | str | None = None) -> EngineSteps:
    """The trace's engine steps (``trace.annotations`` in an engine's format), with ``mix`` applied where the
    counts agree; with no annotated step, a given mix is one step over the whole trace."""
    if isinstance(mix, str):
        mix = parse_mix(mix)
    steps, disagree = [], 0
    for a in trace.annotations:
        hit = parse_annotation(a.name)
        if hit is None:
            continue
        engine, said = hit
        s = EngineStep(engine, a.name, a.ts, a.end, a.thread[0] if a.thread else None,
                       how=f"{engine} step annotation", **said)
        if mix is not None:
            if s.agrees(mix):
                s = replace(s, mix=mix, how=f"{engine} step annotation, KV lengths from --mix {mix.text()}")
            else:
                disagree += 1
        steps.append(s)
    out = EngineSteps()
    if not steps and mix is not None:
        lo = min((g.ts for g in trace.gpu), default=0.0)
        hi = max((g.end for g in trace.gpu), default=0.0)
        lo = min([lo] + [op.ts for op in trace.ops[:1]])
        hi = max([hi] + [op.end for op in trace.ops[-1:]])
        steps.append(EngineStep("given", "--mix", lo, hi, None, _mode(mix.chunks, mix.decodes),
                                len(mix.chunks), mix.prefill_tokens, mix.decode_sequences, mix.decode_sequences, mix,
                                "no engine step annotation: the --mix given is the trace's one step"))
    steps.sort(key=lambda s: (s.ts, -s.end))
    out.steps = steps
    out._starts = [s.ts for s in steps]
    out._longest = max((s.end - s.ts for s in steps), default=0.0)
    if disagree:
        out.notes.append(f"{disagree} engine step(s) annotated with other counts than --mix {mix.text()}: their "
                         "KV lengths are unknown, so their attention is uncosted.")
    unknown = [s for s in steps if s.mix is None and s.mode != "idle"]
    if unknown and mix is None:
        out.notes.append(_lengths_note(unknown))
    return out


def _lengths_note(steps: list) -> str:
    """What to pass when the engine's annotations say a step's requests and tokens but not their KV lengths (no
    engine's annotation does): the first step's counts as a --mix to fill in."""
    s = steps[0]
    parts = []
    if s.prefill_requests or s.prefill_tokens:
        n, t = s.prefill_requests or 1, s.prefill_tokens
        parts.append(f"prefill={n}x{t // n if t else 'TOKENS'}@CACHED")
    if s.decode_requests or s.decode_tokens:
        parts.append(f"decode={s.decode_requests or s.decode_tokens}xCONTEXT")
    example = ",".join(parts) or "decode=BATCHxCONTEXT"
    return (f"{len(steps)} {s.engine} step(s) say their requests and tokens but not their KV lengths (the engine's "
            f"annotations never do): their attention is costed only where its lengths are known; give them with "
            f"--mix, e.g. --mix {example} for {s.name!r}.")
