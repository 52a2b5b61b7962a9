"""The token embedding: a gather of rows of the [vocab, H] table."""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b


def embedding(tokens: int, hidden: int, *, weight_dtype: str = "bf16", act_dtype: str = "bf16",
              vocab_shards: int = 1) -> Cost:
    """Gather rows of the [vocab, H] table: 0 FLOPs.

    Bytes = the T gathered rows (weight dtype, NB: not the whole table) + the output
    [T, H] (activations) + the int64 token ids (8 bytes each).
    Vocab-parallel (``vocab_shards`` = N tensor-parallel ranks, each holding 1/N of the rows):
    a rank gathers only the rows it holds, T/N of them for token ids spread evenly over the
    vocabulary (NB: an expectation, the true share depends on the ids), and still writes the
    whole [T, H] output (zeros where another rank holds the row) for the all-reduce that sums them.
    """
    rows = tokens * hidden * _b(weight_dtype) / vocab_shards
    nbytes = rows + tokens * hidden * _b(act_dtype) + 8 * tokens
    return Cost(0, nbytes)

