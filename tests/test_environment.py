"""The test environment uses nothing of the project from outside the checkout.

A notebook once ran `roofline` as a subprocess: it passed on a developer machine that had the
command installed elsewhere and failed in a fresh clone. `.ci/run` runs the suite with a PATH of
system directories only; these tests fail loudly if the package or the command resolves anywhere
but this checkout and its own environment.
"""

import shutil
import sys
from pathlib import Path

import roofline

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_is_this_checkout():
    assert Path(roofline.__file__).resolve().parent == ROOT / "roofline"


def test_no_roofline_command_outside_this_environment():
    found = shutil.which("roofline")
    if found is None:
        return                      # nothing on PATH: tests must not need it (they call the library)
    inside = Path(found).resolve().is_relative_to(Path(sys.prefix).resolve())
    assert inside, (f"`roofline` on PATH is {found}, outside this test environment ({sys.prefix}): a test or "
                    "notebook that runs it would use another installation. Remove it from PATH.")
