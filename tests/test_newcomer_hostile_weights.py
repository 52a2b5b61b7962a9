"""Issue 33, hostile weight files: a folder named model.safetensors, a symlink to /dev/zero, a sharded checkpoint
whose index names a missing shard or a path outside the folder, one tensor in two files, NaN weights: one line
each, naming the file (and the tensor), in bounded time; the safetensors header and index readers under
hypothesis never raise anything but RooflineError."""

import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from click.testing import CliRunner  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

import hf_tiny as H  # noqa: E402
from cli_errors import one_line_error  # noqa: E402
from kernels import safetensors_files as SF  # noqa: E402
from profiler.cli import main  # noqa: E402
from roofline.errors import RooflineError  # noqa: E402
from roofline.models import load_model  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return H.build_checkpoint("llama", tmp_path_factory.mktemp("hostile-weights") / "llama")


def copy(built, dest, weights=True):
    dest.mkdir()
    shutil.copy(built / "config.json", dest / "config.json")
    if weights:
        shutil.copy(built / "model.safetensors", dest / "model.safetensors")
    return dest


def profile(folder, out):
    return CliRunner().invoke(main, ["profile", "--model", str(folder), "--batches", "1", "--contexts", "8",
                                     "--backends", "torch", "--out", str(out)])


def latency(folder, out):
    return CliRunner().invoke(main, ["latency", "--model", str(folder), "--requests", "1", "--prompt-tokens", "8",
                                     "--output-tokens", "4", "--out", str(out)])


def shard(built, dest):
    """The checkpoint split in two shards with save_pretrained's index."""
    copy(built, dest, weights=False)
    sd = safetensors_torch.load_file(str(built / "model.safetensors"))
    names = sorted(sd)
    half = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for f, ks in half.items():
        safetensors_torch.save_file({k: sd[k] for k in ks}, str(dest / f), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in half.items() for k in ks}}
    (dest / SF.INDEX).write_text(json.dumps(index))
    return dest, index


@pytest.mark.parametrize("command", [profile, latency])
def test_a_folder_named_model_safetensors_is_one_line(built, tmp_path, command):
    d = copy(built, tmp_path / "ck", weights=False)
    (d / "model.safetensors").mkdir()
    one_line_error(command(d, tmp_path / "out"), f"checkpoint file {d / 'model.safetensors'} is a folder")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_symlink_to_dev_zero_is_refused_unread(built, tmp_path):
    d = copy(built, tmp_path / "ck", weights=False)
    os.symlink("/dev/zero", d / "model.safetensors")
    one_line_error(profile(d, tmp_path / "out"), f"{d / 'model.safetensors'} is a device, not a file of tensors")
    with pytest.raises(RooflineError, match="is a device"):
        SF.files_sha256([d / "model.safetensors"])          # the hash never reads it either


def test_a_symlink_to_a_regular_file_is_taken(built, tmp_path):   # the Hugging Face cache's layout
    d = copy(built, tmp_path / "ck", weights=False)
    os.symlink(built / "model.safetensors", d / "model.safetensors")
    assert SF.weight_files(d) == [d / "model.safetensors"]


def test_a_truncated_or_padded_file_is_named_with_what_its_header_promises(built, tmp_path):
    d = copy(built, tmp_path / "ck")
    f = d / "model.safetensors"
    size = f.stat().st_size
    with open(f, "ab") as fh:
        fh.write(b"\0" * 16)
    with pytest.raises(RooflineError, match=f"is {size + 16:,} bytes where its header promises {size:,}"):
        SF.weight_files(d)
    os.truncate(f, size - 100)
    one_line_error(profile(d, tmp_path / "out"), f"{f} is {size - 100:,} bytes where its header promises {size:,}")


def test_a_sharded_checkpoint_loads_through_its_index(built, tmp_path):
    from kernels.checkpoint import load_weights

    d, _ = shard(built, tmp_path / "sh")
    files = SF.weight_files(d)
    assert [f.name for f in files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    w, info = load_weights(load_model(d), d, torch.float32, "cpu")
    whole, _ = load_weights(load_model(built), built, torch.float32, "cpu")
    assert info["files"] == [f.name for f in files] and len(w["layers"]) == 3
    assert torch.equal(w["layers"][2]["w_down"], whole["layers"][2]["w_down"])


def test_an_index_naming_a_missing_shard_names_the_file(built, tmp_path):
    d, _ = shard(built, tmp_path / "sh")
    (d / "model-00002-of-00002.safetensors").unlink()
    one_line_error(profile(d, tmp_path / "out"), f"checkpoint index {d / SF.INDEX} puts",
                   "in model-00002-of-00002.safetensors, which the folder lacks")
    (d / "model-00001-of-00002.safetensors").unlink()      # only the index left: still a checkpoint, still named
    one_line_error(profile(d, tmp_path / "out"), "model-00001-of-00002.safetensors, which the folder lacks")


@pytest.mark.parametrize("path", ["../model-00002-of-00002.safetensors", "/etc/passwd.safetensors",
                                  "model-00002-of-00002.bin"])
def test_an_index_naming_a_path_outside_the_folder_is_refused(built, tmp_path, path):
    d, index = shard(built, tmp_path / "sh")
    k = next(iter(index["weight_map"]))
    index["weight_map"][k] = path
    (d / SF.INDEX).write_text(json.dumps(index))
    one_line_error(profile(d, tmp_path / "out"), f"tensor {k!r} is in {path!r}", "inside the checkpoint folder")


def test_an_index_that_misplaces_a_tensor_is_refused(built, tmp_path):
    d, index = shard(built, tmp_path / "sh")
    k = next(k for k, f in index["weight_map"].items() if f.startswith("model-00001"))
    index["weight_map"][k] = "model-00002-of-00002.safetensors"
    (d / SF.INDEX).write_text(json.dumps(index))
    with pytest.raises(RooflineError, match=f"puts tensor '{k}' in model-00002-of-00002.safetensors, but it is in "
                                            "model-00001-of-00002.safetensors"):
        SF.weight_files(d)


def test_one_tensor_in_two_files_names_both(built, tmp_path):
    d = copy(built, tmp_path / "ck")
    sd = safetensors_torch.load_file(str(d / "model.safetensors"))
    safetensors_torch.save_file({"model.norm.weight": sd["model.norm.weight"] * 2}, str(d / "extra.safetensors"))
    one_line_error(latency(d, tmp_path / "out"),
                   "tensor 'model.norm.weight' is in both extra.safetensors and model.safetensors")


def test_nonfinite_weights_are_named_by_check(built, tmp_path):
    d = copy(built, tmp_path / "ck")
    sd = safetensors_torch.load_file(str(d / "model.safetensors"))
    t = sd["model.layers.1.mlp.up_proj.weight"]
    t[0, :3] = float("nan")
    t[1, 0] = float("inf")
    safetensors_torch.save_file(sd, str(d / "model.safetensors"))
    res = CliRunner().invoke(main, ["check", "--model", str(d), "--backend", "torch", "--no-quality"])
    line = one_line_error(res, "tensor 'model.layers.1.mlp.up_proj.weight' in model.safetensors is not finite",
                          "(3 NaN, 1 Inf values)")
    assert "max rel err" not in line
    assert SF.nonfinite(SF.weight_files(built)) is None


# ---------------------------------------------------------------- property tests of the readers

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8,
           "I64": torch.int64, "U8": torch.uint8, "F64": torch.float64}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_are_refused_only_as_roofline_errors(data):
    try:
        SF.parse_header(data)
    except RooflineError as e:
        assert "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                    max_leaves=12), st.integers(0, 64))
def test_random_json_headers_are_refused_only_as_roofline_errors(obj, extra):
    text = json.dumps(obj).encode()
    data = len(text).to_bytes(8, "little") + text + b"\0" * extra
    try:
        SF.parse_header(data)
    except RooflineError as e:
        assert "\n" not in str(e)
    try:
        SF.parse_index(obj)
        SF.parse_index({"weight_map": obj})
    except RooflineError as e:
        assert "\n" not in str(e)


_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda s: s != "__metadata__")


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_names, st.tuples(st.sampled_from(sorted(_DTYPES)), st.lists(st.integers(0, 4), max_size=3)),
                       max_size=5),
       st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2))
def test_well_formed_files_round_trip(tensors, metadata):
    sd = {k: torch.zeros(shape, dtype=_DTYPES[dt]) for k, (dt, shape) in tensors.items()}
    data = safetensors_torch.save(sd, metadata=metadata or None)
    h = SF.parse_header(data)
    assert {k: (e.dtype, list(e.shape)) for k, e in h.tensors.items()} == \
           {k: (dt, shape) for k, (dt, shape) in tensors.items()}
    assert h.metadata == metadata
    assert 8 + h.length + sum(e.end - e.begin for e in h.tensors.values()) == len(data)
    with pytest.raises(RooflineError, match="where its header promises"):
        SF.parse_header(data + b"\0")


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_names, st.sampled_from(["model.safetensors", "model-00001-of-00002.safetensors",
                                                "sub/model-00002.safetensors"]), min_size=1, max_size=6))
def test_well_formed_indexes_round_trip(weight_map):
    assert SF.parse_index(json.loads(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))) \
        == weight_map


_entries = st.fixed_dictionaries({
    "dtype": st.sampled_from(sorted(SF.DTYPE_BITS) + ["F7", "", "f32"]) | st.integers() | st.none(),
    "shape": st.lists(st.integers(-2, 2 ** 70), max_size=4) | st.text(max_size=3),
    "data_offsets": st.lists(st.integers(-2, 2 ** 70), max_size=3) | st.lists(st.integers(0, 64), min_size=2,
                                                                                max_size=2)})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_names, _entries, max_size=4), st.integers(0, 128), st.integers(-3, 3))
def test_near_valid_headers_are_refused_only_as_roofline_errors(tensors, data, skew):
    text = json.dumps(tensors).encode()
    blob = (len(text) + skew).to_bytes(8, "little", signed=True) + text + b"\0" * data
    try:
        h = SF.parse_header(blob)
    except RooflineError as e:
        assert "\n" not in str(e)
    else:                      # what it takes accounts for every byte of the file
        assert 8 + h.length + max([e.end for e in h.tensors.values()] or [0]) == len(blob)
