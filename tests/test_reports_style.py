"""Op colours follow the run's model: its own ops in the order they run take the palette first."""

import matplotlib

from reports.style import OTHER_OP_COLOR, op_color, op_names
from roofline.layer import LAYER_OP, model_ops, op_order
from roofline.models import PRESETS


def test_a_models_ops_are_coloured_in_its_own_order():
    tiny = PRESETS["tiny"]
    own = tuple(dict.fromkeys(o.name for o in model_ops(tiny)))
    names = op_names(tiny)
    assert names[:len(own)] == own and names[len(own)] == LAYER_OP
    tab20 = matplotlib.colormaps["tab20"]
    assert [op_color(n, tiny) for n in own] == [tab20(i) for i in range(len(own))]
    assert set(op_order()) <= set(names)          # another preset's op still has a colour of its own


def test_without_a_model_the_colours_are_every_presets_order():
    assert op_names(None) == op_order() + (LAYER_OP,)
    assert op_color(op_order()[0]) == matplotlib.colormaps["tab20"](0)
    assert op_color("no-such-op") == OTHER_OP_COLOR
