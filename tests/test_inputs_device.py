"""Device descriptions are checked where they enter: --device-file, --peak-tflops/--bandwidth-gbs, headers.

Every bad input is a one-line RooflineError naming the key, the bad value and the allowed form.
Run: pytest tests/test_inputs_device.py
"""

import json
import math
from pathlib import Path

import pytest

from roofline.devices import GB, T, Device, custom_device, find_device, load_device_file
from roofline.errors import RooflineError

GOOD = {"name": "MyGPU", "peak_tflops": {"bf16": 989}, "bandwidth_gbs": 3350}
PEAK_RULE = 'peak_tflops must map a dtype to a positive number of TFLOP/s, e.g. {"bf16": 989}'
BW_RULE = "bandwidth_gbs must be a positive number of GB/s, e.g. 3350"


def write(tmp_path, text=None, **over) -> Path:
    p = tmp_path / "dev.json"
    p.write_text(json.dumps({**GOOD, **over}) if text is None else text)
    return p


def error(path) -> str:
    with pytest.raises(RooflineError) as e:
        load_device_file(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"device file {path}")
    return msg


def raw(**written) -> str:
    """GOOD as JSON text with some values written verbatim (NaN, Infinity, 1e400 ...)."""
    parts = [f'"{k}": {written.pop(k) if k in written else json.dumps(v)}' for k, v in GOOD.items()]
    parts += [f'"{k}": {v}' for k, v in written.items()]
    return "{" + ", ".join(parts) + "}"


def test_good_file_parsed_exactly(tmp_path):
    d = load_device_file(write(tmp_path, peak_tflops={"bf16": 989, "FP8": 1979.5, "float32": 67}))
    assert d.peak_flops == {"bf16": 989 * T, "fp8": 1979.5 * T, "fp32": 67 * T}
    assert d.bandwidth == 3350 * GB and d.name == "MyGPU" and d.source == "custom"


def test_base_unit_keys_still_accepted(tmp_path):
    d = load_device_file(write(tmp_path, text=json.dumps({"name": "B", "peak_flops": {"bf16": 1e15},
                                                           "bandwidth": 2e12})))
    assert d.peak_flops == {"bf16": 1e15} and d.bandwidth == 2e12


@pytest.mark.parametrize("written, shown", [
    ("989", "989"), ('"989"', '"989" (a string)'), ("null", "null"), ("[989]", "[989] (a list)"),
    ("true", "true (a boolean)"),
])
def test_peak_tflops_not_a_mapping(tmp_path, written, shown):
    msg = error(write(tmp_path, raw(peak_tflops=written)))
    assert msg.endswith(f"{PEAK_RULE}, but {shown} was given.")


def test_peak_tflops_empty(tmp_path):
    assert "at least one dtype" in error(write(tmp_path, peak_tflops={}))


@pytest.mark.parametrize("written, shown", [
    ("-5", "-5"), ("0", "0"), ('"989"', '"989" (a string)'), ("null", "null"), ("NaN", "NaN"),
    ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e400", "1e400 (too large for a number)"),
    ("false", "false (a boolean)"), ("{}", "{}"),
])
def test_each_peak_value(tmp_path, written, shown):
    msg = error(write(tmp_path, raw(peak_tflops='{"bf16": ' + written + "}")))
    assert msg.endswith(f'{PEAK_RULE}, but "bf16": {shown} was given.')


def test_unknown_dtype_key_lists_the_choices(tmp_path):
    msg = error(write(tmp_path, peak_tflops={"bf17": 989}))
    assert "peak_tflops names an unknown dtype" in msg and "'bf17'" in msg and "fp32, tf32, bf16" in msg


def test_same_dtype_twice(tmp_path):
    assert "gives bf16 twice" in error(write(tmp_path, peak_tflops={"bf16": 989, "bfloat16": 900}))


@pytest.mark.parametrize("written, shown", [
    ("-3350", "-3350"), ("0", "0"), ('"3350"', '"3350" (a string)'), ("null", "null"), ("NaN", "NaN"),
    ("Infinity", "Infinity"), ('{"hbm": 3350}', '{"hbm": 3350}'),
])
def test_bandwidth_gbs(tmp_path, written, shown):
    msg = error(write(tmp_path, raw(bandwidth_gbs=written)))
    assert msg.endswith(f"{BW_RULE}, but {shown} was given.")


def test_missing_keys(tmp_path):
    assert "needs 'peak_tflops'" in error(write(tmp_path, text=json.dumps({"name": "x", "bandwidth_gbs": 1})))
    assert "'bandwidth_gbs'" in error(write(tmp_path, text=json.dumps({"name": "x", "peak_tflops": {"bf16": 1}})))
    assert "at least 'name'" in error(write(tmp_path, text=json.dumps({"peak_tflops": {"bf16": 1}})))
    assert "at least 'name'" in error(write(tmp_path, text="[1]"))


def test_other_numbers_in_the_file(tmp_path):
    msg = error(write(tmp_path, raw(memory_bytes="-1")))
    assert "memory_bytes must be a finite number of bytes, zero or more, but -1 was given." in msg
    assert "sms must be zero or more, but -4 was given" in error(write(tmp_path, raw(sms="-4")))
    assert "name must be a non-empty string, but 7 was given" in error(write(tmp_path, name=7))


def test_a_binary_file(tmp_path):
    p = tmp_path / "dev.json"
    p.write_bytes(b"\x00\xff\xfe\x89binary")
    assert "not a UTF-8 text file" in error(p)


def test_a_folder(tmp_path):
    p = tmp_path / "dev.json"
    p.mkdir()
    assert "is a folder, not a file" in error(p)


def test_missing_and_bad_json(tmp_path):
    assert "does not exist" in error(tmp_path / "nope.json")
    assert "not valid JSON" in error(write(tmp_path, "{oops"))


# ---- --peak-tflops / --bandwidth-gbs -----------------------------------------------------------

@pytest.mark.parametrize("peak, bw, expect", [
    (math.nan, 3350, "--peak-tflops must be a positive, finite number of dense TFLOP/s (e.g. 989), but nan was given."),
    (math.inf, 3350, "--peak-tflops must be a positive, finite number of dense TFLOP/s (e.g. 989), but inf was given."),
    (0, 3350, "--peak-tflops must be a positive, finite number of dense TFLOP/s (e.g. 989), but 0 was given."),
    (-1.5, 3350, "--peak-tflops must be a positive, finite number of dense TFLOP/s (e.g. 989), but -1.5 was given."),
    (989, math.nan, "--bandwidth-gbs must be a positive, finite number of GB/s (e.g. 3350), but nan was given."),
    (989, -math.inf, "--bandwidth-gbs must be a positive, finite number of GB/s (e.g. 3350), but -inf was given."),
    (989, 0.0, "--bandwidth-gbs must be a positive, finite number of GB/s (e.g. 3350), but 0.0 was given."),
    (989, -2, "--bandwidth-gbs must be a positive, finite number of GB/s (e.g. 3350), but -2 was given."),
])
def test_custom_device_says_which_number_is_wrong(peak, bw, expect):
    with pytest.raises(RooflineError) as e:
        custom_device(peak, bw)
    assert str(e.value) == expect


def test_custom_device_with_only_one_number():
    with pytest.raises(RooflineError) as e:
        custom_device(None, 3350)
    assert "only --bandwidth-gbs 3350 was given: add --peak-tflops." in str(e.value)
    with pytest.raises(RooflineError) as e:
        custom_device(989, None)
    assert "only --peak-tflops 989 was given: add --bandwidth-gbs." in str(e.value)


def test_custom_device_good():
    d = custom_device(989, 3350)
    assert d.peak("bf16") == 989 * T and d.peak("fp16") == 989 * T and d.bandwidth == 3350 * GB


# ---- Device.from_dict (result-file headers) ------------------------------------------------------

def test_from_dict_round_trip():
    h = find_device("h100")
    back = Device.from_dict(h.to_dict())
    assert back.peak_flops == h.peak_flops and back.bandwidth == h.bandwidth and back.sms == h.sms


@pytest.mark.parametrize("key, value, expect", [
    ("bandwidth", math.nan, "bandwidth must be a finite number of byte/s, zero or more, but NaN was given."),
    ("bandwidth", -1.0, "bandwidth must be a finite number of byte/s, zero or more, but -1.0 was given."),
    ("bandwidth", None, "bandwidth must be a finite number of byte/s, zero or more, but null was given."),
    ("memory_bytes", math.inf, "memory_bytes must be a finite number of bytes, zero or more, but Infinity was given."),
    ("l2_bytes", -5, "l2_bytes must be a finite number of bytes, zero or more, but -5 was given."),
    ("peak_flops", {"bf16": -1.0}, 'peak_flops must map a dtype to a finite number of FLOP/s, zero or more, '
                                   'but "bf16": -1.0 was given.'),
    ("peak_flops", {"bf16": math.inf}, '"bf16": Infinity was given.'),
    ("peak_flops", None, "peak_flops must map a dtype"),
    ("peak_flops", {"bf99": 1.0}, "peak_flops names an unknown dtype"),
    ("sms", -1, "sms must be zero or more"),
])
def test_from_dict_names_the_bad_ceiling(key, value, expect):
    d = dict(find_device("h100").to_dict(), **{key: value})
    with pytest.raises(RooflineError) as e:
        Device.from_dict(d)
    assert str(e.value).startswith("device description 'NVIDIA H100 SXM5 80GB': ") and expect in str(e.value)


def test_from_dict_accepts_an_unmeasured_cpu():
    d = Device.from_dict({"name": "CPU", "kind": "cpu", "peak_flops": {}, "bandwidth": 0.0})
    assert d.peak_flops == {} and d.bandwidth == 0.0
