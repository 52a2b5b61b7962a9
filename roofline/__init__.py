"""roofline: the pure cost model (numpy and the standard library only); what other packages and notebooks use.

The folders show the architecture: ``ops/`` (the op kinds: a registry and one entry per kind) over ``formulas/``
(every FLOP and byte count, split by kind); ``families/`` (one config reader per Hugging Face ``model_type``) and
``precision/`` (the number formats, counted to the byte) feeding the model (``models``: ``ModelConfig``;
``layer``: its ops as data; ``workload``: a phase's costs; ``capacity``; ``parallel``); the results
(``records``: typed result files, ``writer``: the one writer, ``analysis``: the one reading into ``Step``s);
``verdicts/`` (findings: diagnosis and compare rules in one registry); ``traces/`` (profiler traces read and
costed by a registry of rules, one file per ecosystem).

This face exports what a caller needs::

    from roofline import load_model, decode, find_device, analyze_phase
    phase = decode(load_model("llama-3-8b"), batch=1, context=1024)
    analyze_phase(phase, find_device("h100"))                # bound, roof fraction, predicted time
    run = analyze(read_results("roofline-out/results.jsonl")) # every Step of a result file
    findings = diagnose(["roofline-out/results.jsonl"])      # evidence -> what to try next
"""

import importlib

from .bounds import (COMPUTE, MEMORY, OVERHEAD, analyze_phase, attainable, bound, predicted_time,
                     ridge_crossings, roof_fraction)
from .cost import Cost
from .devices import CATALOGUE, Device, cpu_device, custom_device, find_device, load_device_file
from .errors import RooflineError
from .layer import model_ops, op_names
from .models import PRESETS, ModelConfig, load_model
from .workload import Phase, decode, prefill, request_steps

# Loaded on first use (PEP 562), so that ``import roofline.units`` and the CLI's start-up stay as cheap as the
# cost model itself: name -> the module that owns it.
_LAZY = {
    "analyze": "analysis", "RunAnalysis": "analysis", "Step": "analysis", "read_results": "records",
    "ExplainSpec": "explain", "explain_step": "explain",
    "weight_format": "precision", "act_format": "precision", "kv_format": "precision", "weight_bytes": "precision",
    "analyze_trace": "traces.analyze", "compare": "verdicts.comparison", "diagnose": "verdicts.diagnosis",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'roofline' has no attribute {name!r}")


__all__ = [
    "COMPUTE", "MEMORY", "OVERHEAD", "analyze_phase", "attainable", "bound", "predicted_time",
    "ridge_crossings", "roof_fraction", "Cost", "CATALOGUE", "Device", "cpu_device", "custom_device",
    "find_device", "load_device_file", "RooflineError", "PRESETS", "ModelConfig", "load_model",
    "model_ops", "op_names", "Phase", "decode", "prefill", "request_steps",
    "weight_format", "act_format", "kv_format", "weight_bytes", "read_results", "analyze", "RunAnalysis", "Step",
    "diagnose", "compare", "analyze_trace", "ExplainSpec", "explain_step",
]
