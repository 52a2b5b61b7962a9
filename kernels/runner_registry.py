"""The runner registry: what runs each op kind of ``roofline.layer.model_ops`` on a profiling point, and what the
compile check launches for that kind beyond the runners.

    @runner("rope")
    def rope(ctx, spec):            # ctx: kernels.runner_context.RunContext; spec: roofline.op_spec.OpSpec
        return (lambda: ctx.K.rope(ctx.q, ctx.k, ctx.cos, ctx.sin, ctx.pos)), {}   # (fn, config)

    @launches("attention")
    def attention_extras(rec, combo):   # combo: ``MetaCombo``; set rec.context, then launch on meta tensors
        ...

A builder returns ``(fn, config)``: ``fn`` runs the op once on the context's preallocated inputs, ``config`` says
which kernel ran (block sizes, the torch path); a ``"cost"`` in it replaces the workload's (expert parallelism:
one rank's own load). ``kernels.runners.make_runners`` builds one runner per op of the model through
``builder(spec.kind)``; ``kernels.variants.record`` calls every ``LAUNCHES`` entry once per quick-set combo.
Entries live in ``kernels.runners_*`` (or a test file); this module imports none of them and none of its
consumers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from roofline.errors import RooflineError

RUNNERS: dict[str, Callable] = {}     # op kind -> builder(ctx, spec) -> (fn, config)
LAUNCHES: dict[str, Callable] = {}    # op kind -> extra compile-check launches(rec, combo)
NEEDS: dict[str, int] = {}             # Triton kernel -> the lowest target capability that launches it (fp8: 89)
CHECKS: dict[str, "CheckGroup"] = {}   # roofline check's groups of rows, by name (each says the kinds it checks)
CHECK_PARTS = ("kernels", "model", "quant")   # roofline check --part order


@dataclass(frozen=True)
class CheckGroup:
    """A group of ``roofline check`` rows: its part, the op kinds its rows check, its place in the part, and
    ``rows(ops, dt, dev, quick, model) -> [CheckResult]``."""

    name: str
    part: str
    kinds: tuple
    order: int
    rows: Callable


@dataclass(frozen=True)
class MetaCombo:
    """One compile-check combo: where it is (model, phase, b, ctx, dtype: the launches' context), the model's
    config, the phase's sizes, the torch dtype and the target GPU (``kernels.variants.Target``)."""

    where: dict
    cfg: object
    phase: str
    batch: int
    context: int
    dt: object
    target: object

    @property
    def tokens(self) -> int:
        return self.batch * (self.context if self.phase == "prefill" else 1)


def _register(table: dict, kind: str, what: str):
    def deco(fn):
        if kind in table and table[kind] is not fn:
            raise RooflineError(f"op kind {kind!r} already has {what} ({table[kind].__module__}).")
        table[kind] = fn
        return fn
    return deco


def runner(kind: str):
    """Register the runner builder of op kind ``kind``."""
    return _register(RUNNERS, kind, "a runner")


def needs_capability(capability: int, *kernels: str) -> None:
    """Say that ``kernels`` are launched only on targets of at least ``capability`` (e.g. 89 for fp8): a compile
    check of lower targets alone does not count them unreached."""
    NEEDS.update({k: capability for k in kernels})


def checks(name: str, part: str, kinds: tuple, order: int):
    """Register ``roofline check`` rows (the decorated ``rows(ops, dt, dev, quick, model)``) for op ``kinds``."""
    if part not in CHECK_PARTS:
        raise RooflineError(f"check group {name!r}: part {part!r} is not one of {', '.join(CHECK_PARTS)}.")

    def deco(fn):
        CHECKS[name] = CheckGroup(name, part, tuple(kinds), order, fn)
        return fn
    return deco


def check_groups(parts=CHECK_PARTS) -> list:
    """The registered check groups of ``parts``, part by part (``CHECK_PARTS``' order), then by their order."""
    return sorted((g for g in CHECKS.values() if g.part in parts), key=lambda g: (CHECK_PARTS.index(g.part), g.order))


def launches(kind: str):
    """Register what the compile check launches for op kind ``kind`` beyond its runners."""
    return _register(LAUNCHES, kind, "compile-check launches")


def builder(kind: str) -> Callable:
    """The runner builder of ``kind``; an unknown kind is refused in one line naming the registered ones."""
    try:
        return RUNNERS[kind]
    except KeyError:
        raise RooflineError(f"no runner for op kind {kind!r}: the registered kinds are "
                            f"{', '.join(sorted(RUNNERS))}.") from None
