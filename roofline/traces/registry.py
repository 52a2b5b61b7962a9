"""The trace cost rules: one registry that rule files fill with ``@rule`` and consumers read.

A rule says what it matches, its category and how it costs::

    from roofline.traces.registry import rule

    @rule(names=("aten::mm",), category="gemm", tensor_cores=True)
    def mm(a):                       # a: roofline.traces.opcost.OpArgs
        return a.op(cost, dtype, signature)     # or FRAMEWORK, or None (uncosted)

* ``names``: exact op names (``aten::mm``); ``pattern``: a regular expression searched in the op
  name as recorded (custom ops and kernels by family: ``(?i)rms_?norm``); ``kernels``: one searched
  in the lower-cased name of a GPU kernel, which gives a kernel with no op its category
  (``kernel_category``; ``kernel_rule(category, pattern)`` registers one with no cost). A rule with
  ``kernels`` and a cost function but no op names or pattern (a *kernel rule*) *costs* such a kernel: it is called with a ``KernelArgs`` (the kernel's
  name, its launching op's recorded inputs, the engine step it ran in, ``--model``: ``opcost.KernelArgs``)
  for a kernel whose op no rule costs, or that no op launched (``cost.cost_kernel``).
* ``category``: the category of what it costs, or a tuple when it costs into several (copy, cast):
  the first is the default. The category list (``categories()``) is the rules' own, in
  registration order, after ``NON_RULE_CATEGORIES``: there is no second list.
* ``shapes``: False when the rule costs without recorded shapes (a collective's message sizes);
  ``tensor_cores``: the op runs at its dtype's tensor-core peak (else the fp32 vector peak).
* ``priority``: higher is tried first (default 0); equal priorities keep registration order.

Match order (deterministic): an op name is looked up among the exact ``names`` first (the highest
priority, then the first registered, wins), then the ``pattern`` rules in (priority, registration)
order; kernel names go through the ``kernels`` patterns in the same order. The first rule that
matches decides: its None is "uncosted", no later rule is tried. The built-in rules register on
import of ``roofline.traces.rules`` (a fixed file order: collectives, aten, sdpa, elementwise,
custom, vllm, sglang, triton_inductor, kernel_names, layer_position); ``load_rules(path)`` adds a user's file
after them (``roofline trace --rules FILE``).

This module imports none of its rules and none of its consumers.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import RooflineError

# categories no rule declares: what the trace reader gives a kernel or an op no rule costs
NON_RULE_CATEGORIES = ("memcpy", "memset", "graph replay", "other")


@dataclass(frozen=True)
class Rule:
    label: str                       # module.function, for messages
    categories: tuple
    cost: object = None              # OpArgs -> OpCost | FRAMEWORK | None; None: a kernel-name rule only
    names: tuple = ()
    pattern: object = None           # compiled regex on op names
    kernels: object = None           # compiled regex on lower-cased kernel names
    shapes: bool = True
    tensor_cores: bool = False
    priority: int = 0
    seq: int = 0


RULES: list = []          # in registration order
_EXACT: dict = {}         # op name -> [Rule] (best first)
_PATTERNS: list = []      # [Rule] with a pattern, best first
_KERNELS: list = []       # [Rule] with a kernel pattern, best first
_FOUND: dict = {}         # ("op" | "kernel", name) -> Rule | None: a trace repeats its names millions of times


def _order(r: Rule):
    return (-r.priority, r.seq)


def _index() -> None:
    _EXACT.clear()
    _FOUND.clear()
    for r in sorted(RULES, key=_order):
        for n in r.names:
            _EXACT.setdefault(n, []).append(r)
    _PATTERNS[:] = [r for r in sorted(RULES, key=_order) if r.pattern is not None]
    _KERNELS[:] = [r for r in sorted(RULES, key=_order) if r.kernels is not None]


def register(r: Rule) -> Rule:
    if not r.categories or not all(isinstance(c, str) and c for c in r.categories):
        raise RooflineError(f"trace rule {r.label} must declare a category (a non-empty string).")
    if r.cost is None and (r.names or r.pattern is not None):
        raise RooflineError(f"trace rule {r.label} matches op names but has no cost function.")
    if not r.names and r.pattern is None and r.kernels is None:
        raise RooflineError(f"trace rule {r.label} matches nothing: give names, pattern or kernels.")
    RULES.append(r)
    _index()
    return r


def unregister(fn) -> None:
    """Remove the rules whose cost function is ``fn`` (a test's or a notebook's own rule, when it is done)."""
    RULES[:] = [r for r in RULES if r.cost is not fn]
    _index()


def _compile(p, label):
    if p is None or isinstance(p, re.Pattern):
        return p
    try:
        return re.compile(p)
    except re.error as e:
        raise RooflineError(f"trace rule {label}: pattern {p!r} is not a regular expression ({e}).") from None


def rule(names=(), pattern=None, *, category, kernels=None, shapes: bool = True, tensor_cores: bool = False,
         priority: int = 0):
    """Register the decorated function as a trace cost rule (see the module docstring)."""
    def add(fn):
        label = f"{fn.__module__}.{fn.__qualname__}"
        register(Rule(label, (category,) if isinstance(category, str) else tuple(category), fn,
                      (names,) if isinstance(names, str) else tuple(names), _compile(pattern, label),
                      _compile(kernels, label), shapes, tensor_cores, priority, len(RULES)))
        return fn
    return add


def kernel_rule(category: str, kernels: str, priority: int = 0) -> Rule:
    """A rule that only names the category of GPU kernels whose (lower-cased) name matches ``kernels``."""
    label = f"kernels {category}"
    return register(Rule(label, (category,), kernels=_compile(kernels, label), priority=priority, seq=len(RULES)))


def rule_for(name: str) -> Rule | None:
    """The rule that costs op ``name``: exact names first, then patterns (see the match order above)."""
    key = ("op", name)
    if key in _FOUND:
        return _FOUND[key]
    hit = _EXACT.get(name)
    found = hit[0] if hit else next((r for r in _PATTERNS if r.pattern.search(name)), None)
    _FOUND[key] = found
    return found


def kernel_rule_for(name: str) -> Rule | None:
    """The rule whose kernel pattern matches a GPU kernel's name (lower-cased), or None."""
    key = ("kernel", name)
    if key in _FOUND:
        return _FOUND[key]
    low = name.lower()
    found = _FOUND[key] = next((r for r in _KERNELS if r.kernels.search(low)), None)
    return found


def categories() -> tuple:
    """Every category a trace's ops and kernels can have: the non-rule ones, then the rules' own."""
    out = dict.fromkeys(NON_RULE_CATEGORIES)
    for r in RULES:
        out.update(dict.fromkeys(r.categories))
    return tuple(out)


def load_rules(path) -> list:
    """Import a user's Python file whose ``@rule`` decorators register; the rules it added.

    Refused in one line: a missing file, one that is not a ``.py`` file, one that raises on import.
    """
    p = Path(path)
    if not p.is_file():
        raise RooflineError(f"rules file {p} does not exist.")
    if p.suffix != ".py":
        raise RooflineError(f"rules file {p} is not a Python file (.py).")
    before = len(RULES)
    name = f"roofline_user_rules_{abs(hash(str(p.resolve())))}"
    try:
        spec = importlib.util.spec_from_file_location(name, p)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    except Exception as e:      # noqa: BLE001 - any error in the user's file is refused in one line
        sys.modules.pop(name, None)
        del RULES[before:]          # a file that fails adds none of its rules
        _index()
        why = str(e).strip().splitlines()
        raise RooflineError(f"rules file {p} failed on import: {type(e).__name__}"
                            + (f": {why[0]}" if why else "") + ".") from None
    return RULES[before:]
