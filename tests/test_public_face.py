"""roofline's public face: every exported name is the owner module's object, and the heavy parts load on use."""

import importlib
import subprocess
import sys

import roofline


def test_every_export_is_its_owners_object():
    for name in roofline.__all__:
        obj = getattr(roofline, name)
        owner = roofline._LAZY.get(name)
        if owner:
            assert obj is getattr(importlib.import_module(f"roofline.{owner}"), name), name
        assert obj is not None, name
    assert set(roofline._LAZY) <= set(roofline.__all__)


def test_import_roofline_loads_no_result_reader_or_verdicts():
    code = ("import sys, roofline; heavy = [m for m in ('roofline.analysis', 'roofline.records', "
            "'roofline.verdicts.diagnosis', 'roofline.traces.analyze', 'matplotlib', 'torch') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_face_answers_the_seed():
    """The seed's numbers through the face alone: a 4,096 x 4,096 bf16 weight is 33,554,432 bytes."""
    assert roofline.weight_bytes(roofline.weight_format("bf16"), 4096, 4096) == 33_554_432
    ph = roofline.decode(roofline.load_model("llama-3-8b"), batch=1, context=1024)
    assert roofline.analyze_phase(ph, roofline.find_device("h100")).bound_by_sum == roofline.MEMORY
