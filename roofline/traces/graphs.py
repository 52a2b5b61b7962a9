"""CUDA/HIP graph replays, and what a kernel is by its name.

vLLM and SGLang run decode as graph replays: one ``cudaGraphLaunch`` (``hipGraphLaunch``)
replays hundreds of kernels that carry no op and no shapes. Two ways to read them:

* With the framework's graph-capture trace(s) (a trace recorded while the graphs were
  captured, or an eager run of the same step: its kernels joined to their ops, with shapes):
  ``ReplayMap`` maps each replayed kernel back to the captured op that launched a kernel of
  the same name, in order within the graph. Each launch is matched against every capture
  trace and the one matching most kernels (in order) wins; kernels that match nothing stay
  unmapped. Launches with the same kernel sequence (the same graph) are matched once.
* Without one: each replayed kernel is its own instance, listed by its kernel name, time and
  category (``roofline.traces.analyze``): ``kernel_category`` names what each kernel is from its
  name (gemm, attention, communication, norm, ...) by the registry's kernel-name rules
  (``roofline.traces.rules.kernel_names``); a kernel-name rule with a cost function costs it
  (``cost.cost_kernel``), else it is uncosted (a replayed kernel has no shapes).

Kernel names are matched by their first 120 characters (template arguments can differ in
their tails between a capture and a replay build of the same kernel).
"""

from __future__ import annotations

from . import rules  # noqa: F401  (registers the built-in rules: kernel names among them)
from .registry import kernel_rule_for

NAME_PREFIX = 120


def kernel_category(name: str, kind: str = "kernel") -> str:
    """What a GPU activity is, from its name: gemm, attention, communication, ..., or "other"."""
    if kind in ("memcpy", "memset"):
        return kind
    r = kernel_rule_for(name)          # the rules' kernel-name patterns (rules.kernel_names), in match order
    return r.categories[0] if r is not None else "other"


def _key(name: str) -> str:
    return name[:NAME_PREFIX]


def capture_sequence(trace) -> list:
    """[(kernel name key, launching op)] of a capture trace's kernels that joined an op, in time order.

    A kernel launched while a graph is being captured does not run, so a capture trace may record it only as
    its launch call (ROCm: ``hipLaunchKernel`` / ``hipExtModuleLaunchKernel`` with ``args.kernel``, no kernel
    event). Such launches count too: the kernel named in ``args.kernel``, charged to the innermost op around the
    call. When there are any, the sequence is in launch order (kernel events by their launch call's time)."""
    seen = {g.corr for g in trace.gpu if g.corr is not None}
    named = [ln for ln in trace.launches.values() if ln.kernel and ln.corr not in seen]
    if not named:
        return [(_key(g.name), g.op) for g in trace.gpu if g.kind == "kernel" and g.op is not None
                and g.graph is None]
    out = [(g.launch.ts if g.launch is not None else g.ts, _key(g.name), g.op) for g in trace.gpu
           if g.kind == "kernel" and g.op is not None and g.graph is None]
    for ln in named:
        op = trace.op_at(ln.thread, ln.ts)
        if op is not None:
            out.append((ln.ts, _key(ln.kernel), op))
    out.sort(key=lambda x: x[0])
    return [(k, op) for _, k, op in out]


def _match(names, seq, window: int = 256) -> list:
    """For each name, the index in ``seq`` it matches in order (greedy, within ``window``), or None."""
    out, j = [], 0
    for n in names:
        hit = None
        for i in range(j, min(j + window, len(seq))):
            if seq[i][0] == n:
                hit = i
                break
        out.append(hit)
        if hit is not None:
            j = hit + 1
    return out


class ReplayMap:
    """Replayed graph kernels -> the captured ops that launched kernels of the same name, in order."""

    def __init__(self, capture_traces):
        self.sequences = [capture_sequence(t) for t in capture_traces]
        self._memo: dict = {}
        self.matched = 0
        self.unmatched = 0

    def map_launch(self, kernels) -> list:
        """The captured op for each kernel of one graph launch (in start order), or None."""
        names = tuple(_key(g.name) for g in kernels)
        hit = self._memo.get(names)
        if hit is None:
            best, best_n = [None] * len(names), 0
            for seq in self.sequences:
                idx = _match(names, seq)
                n = sum(i is not None for i in idx)
                if n > best_n:
                    best, best_n = [seq[i][1] if i is not None else None for i in idx], n
            hit = self._memo[names] = best
        self.matched += sum(o is not None for o in hit)
        self.unmatched += sum(o is None for o in hit)
        return hit


def graph_launches(trace) -> dict:
    """{launch correlation: [kernels of that replay, by start]} for a trace's graph replays."""
    out: dict = {}
    for g in trace.gpu:
        if g.graph is not None:
            out.setdefault(g.graph, []).append(g)
    return out
