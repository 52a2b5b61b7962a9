"""Shared fixtures: a seeded rng, closed figures, the Triton interpreter on CPU machines."""

import os

# Under pytest-xdist (`make test` runs two workers on a 2-core box), each worker and the processes it
# starts use one OpenMP thread: two workers of two threads each would fight over the same two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("ROOFLINE_RENDER_PROCESSES", "1")   # reports drawn in the worker, not in two more

# The Triton interpreter must be chosen before triton is imported anywhere.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

import tempfile

import numpy as np
import pytest

# Caches (ceilings, FLOP checks, kernel checks, compiled variants) go to a fresh folder per session:
# a test never reads what another session, or the user's own runs, left in ~/.cache/roofline.
os.environ["ROOFLINE_CACHE_DIR"] = tempfile.mkdtemp(prefix="roofline-test-cache-")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_gpu = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu_check.sh on a GPU box)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)
