"""One rule for every judgment over several inputs: one model on one device, or said (pure).

``roofline compare`` (two result files) and ``roofline diagnose`` (its files, and the ``--model`` / ``--device``
its floors use) judge one workload: files of different models, or measured on different devices, would be merged
into one finding, or judged against another machine's floor, without a word. ``check_same_setup`` refuses that in
one line naming each input's model and device, unless the user asks for it (``across_models``, the CLI's
``ACROSS_FLAG``); then it returns the sentences every output says on top.

A model or device an input does not know is no difference: a trace or counters file has no model, a latency file
measured from a client (``latency --endpoint``) knows no device (``Device.kind`` "server", source "unknown").
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RooflineError

ACROSS_FLAG = "--across-models"


@dataclass(frozen=True)
class Setup:
    """What one input of a judgment ran: ``where`` names it (a file, "--model"), "" for what it does not know."""

    where: str
    model: str = ""
    device: str = ""


def device_name(device) -> str:
    """The name a device is matched by, or "" when it is not known (a client's view of a server)."""
    if device is None or device.kind == "server" or device.source == "unknown":
        return ""
    return device.name


def setup_of(rf) -> Setup:
    """A result file's model (its header's ``ModelConfig``) and device."""
    h = rf.header
    return Setup(str(getattr(rf, "path", "")), h.model.name if h.model is not None else "", device_name(h.device))


def check_same_setup(setups, *, across_models: bool = False, what: str = "judged together") -> list:
    """[] when every known model and every known device of ``setups`` agree; else RooflineError in one line, or
    (``across_models``) the one sentence that says it on top of the output."""
    diffs = []
    for attr, noun in (("model", "models"), ("device", "devices")):
        known = [(s.where, getattr(s, attr)) for s in setups if getattr(s, attr)]
        if len({v for _, v in known}) > 1:
            diffs.append(f"different {noun}: " + ", ".join(f"{w} {v}" for w, v in known))
    if not diffs:
        return []
    if not across_models:
        raise RooflineError("; ".join(diffs) + f": these cannot be {what} as one workload. Give inputs of one model "
                            f"on one device, or pass {ACROSS_FLAG} to judge across them anyway.")
    return [f"Across models or devices, as asked ({ACROSS_FLAG}): {'; '.join(diffs)}."]
