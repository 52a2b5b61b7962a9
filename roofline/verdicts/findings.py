"""The findings registry: the ``Finding`` type, ``@finding`` / ``register``, and ``run`` (pure).

A finding is a claim, the evidence line it rests on, an action, the file it came from and the numbers
behind it. Rules live in their own modules (``latency_rules``, ``phase_rules``, ``expert_rules``,
``trace_rules``, ``counter_rules``, ``change_rules``) and register here; the consumers
(``roofline.verdicts.diagnosis``: ``diagnose``, ``change_findings``) call ``run(scope, ...)`` and never
name a rule. This module imports none of its entries or consumers.

Each rule belongs to one *scope*, which says what it is run over and so what ``run`` passes it:

* ``latency``  one latency configuration: ``(cfg)``, a ``latency_rules.ConfigRun``.
* ``phase``    one phase of one backend of a profile file: ``(phase, backend, steps, device, src)``; ``backend``
               is "" when the file measured one backend, ``steps`` are the reliable ``Step``s.
* ``backend``  one backend of a profile file: ``(analysis, backend, several, src)``.
* ``run``      a whole profile / trace / counters file: ``(result_file, analysis, src)``.
* ``change``   a before/after comparison: ``(comparison, src)``.

A rule returns a ``Finding``, an iterable of them, or None (it did not fire). Order is deterministic and
documented: within a scope, rules run by ascending ``order``, ties by name; the order a module registers
in, or is imported in, never matters. Registering a name again in its scope replaces the earlier entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

DOMINANT = 0.5        # a share of time above half "dominates" (the rules of every scope share it)

SCOPES = ("latency", "phase", "backend", "run", "change")


@dataclass(frozen=True)
class Finding:
    rule: str
    claim: str
    evidence: str
    action: str = ""
    source: str = ""
    data: dict = field(default_factory=dict)   # the numbers behind the claim, for --json (latency-floor)

    def to_dict(self) -> dict:
        d = {"rule": self.rule, "claim": self.claim, "evidence": self.evidence, "action": self.action,
             "source": self.source}
        if self.data:
            d["data"] = dict(self.data)
        return d

    def text(self) -> str:
        out = [f"- {self.claim}", f"    evidence: {self.evidence}"]
        if self.action:
            out.append(f"    try: {self.action}")
        return "\n".join(out)


@dataclass(frozen=True)
class Rule:
    scope: str
    name: str          # the finding rule it emits (or the family, e.g. "expert" for expert-bound/-imbalance)
    order: int         # position in its scope: ascending, ties by name
    fn: Callable


_RULES: dict = {s: {} for s in SCOPES}   # scope -> {name: Rule}


def register(scope: str, name: str, fn: Callable, *, order: int) -> Rule:
    """Add ``fn`` as rule ``name`` of ``scope`` (see the module docstring for what each scope passes)."""
    if scope not in _RULES:
        raise ValueError(f"unknown findings scope {scope!r}: one of {', '.join(SCOPES)}")
    r = Rule(scope, name, order, fn)
    _RULES[scope][name] = r
    return r


def unregister(rule: Rule) -> None:
    """Remove ``rule`` (what ``register`` returned) from its scope, if it is still the registered one."""
    if _RULES.get(rule.scope, {}).get(rule.name) is rule:
        del _RULES[rule.scope][rule.name]


def finding(scope: str, name: str, *, order: int):
    """Decorator form of ``register``: ``@finding("phase", "overhead-bound", order=60)``."""
    def deco(fn):
        register(scope, name, fn, order=order)
        return fn
    return deco


def rules(scope: str) -> list:
    """The rules of ``scope`` in run order (ascending ``order``, ties by name)."""
    return sorted(_RULES[scope].values(), key=lambda r: (r.order, r.name))


def run(scope: str, *args) -> list:
    """Every finding the rules of ``scope`` make of ``args``, in run order."""
    out = []
    for r in rules(scope):
        got = r.fn(*args)
        if got is None:
            continue
        if isinstance(got, Finding):
            out.append(got)
        else:
            out += [f for f in got if f is not None]
    return out
