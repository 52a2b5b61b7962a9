"""roofline: the pure cost model (numpy and the standard library only).

Devices and their ceilings, ``Cost``, op cost formulas, the LLM workload model,
bound classification, result records and diagnosis rules.
"""

from .bounds import (COMPUTE, MEMORY, OVERHEAD, analyze_phase, attainable, bound, predicted_time,
                     ridge_crossings, roof_fraction)
from .cost import Cost
from .devices import CATALOGUE, Device, cpu_device, custom_device, find_device, load_device_file
from .errors import RooflineError
from .models import PRESETS, ModelConfig, load_model
from .layer import model_ops, op_names
from .workload import Phase, decode, prefill, request_steps

__all__ = [
    "COMPUTE", "MEMORY", "OVERHEAD", "analyze_phase", "attainable", "bound", "predicted_time",
    "ridge_crossings", "roof_fraction", "Cost", "CATALOGUE", "Device", "cpu_device", "custom_device",
    "find_device", "load_device_file", "RooflineError", "PRESETS", "ModelConfig", "load_model",
    "model_ops", "op_names", "Phase", "decode", "prefill", "request_steps",
]
