"""A byte-level UTF-8 tokenizer that ships with the project (nothing downloaded).

Ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>, then 4 + byte for each of the 256 byte values
(260 ids). Every string round-trips exactly; one ASCII character is one token, so a
prompt of N tokens is <bos> + N - 1 ASCII characters.

The serving model has its own vocabulary (random weights, any size): ``to_model`` maps
ids into ``range(vocab)`` (identity when vocab >= 260, else modulo), and ``from_model``
maps a generated model id back to a byte (or nothing, for a special id). Streaming
output goes through ``StreamDecoder``, which holds back an incomplete UTF-8 sequence.

>>> tok = ByteTokenizer()
>>> ids = tok.encode("héllo")
>>> ids[0] == tok.bos, len(ids)          # <bos> + 6 bytes ("é" is two)
(True, 7)
>>> tok.decode(ids)
'héllo'
"""

from __future__ import annotations

import codecs

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
OFFSET = len(SPECIALS)
VOCAB = OFFSET + 256

_WORDS = ("the model reads a prompt then predicts tokens one at a time while the cache keeps keys and values "
          "for every earlier position so decode steps reuse prefill work and memory bandwidth limits small "
          "batches whereas long prompts give the arithmetic units enough work").split()


class ByteTokenizer:
    pad, bos, eos, unk = 0, 1, 2, 3
    vocab_size = VOCAB

    def encode(self, text: str, *, bos: bool = True) -> list:
        return ([self.bos] if bos else []) + [OFFSET + b for b in text.encode("utf-8")]

    def decode(self, ids) -> str:
        return bytes(i - OFFSET for i in ids if OFFSET <= i < VOCAB).decode("utf-8", errors="replace")

    @staticmethod
    def to_model(ids, vocab: int) -> list:
        """Our ids -> the model's vocabulary: identity when it fits, else folded modulo ``vocab``."""
        return [i if i < vocab else i % vocab for i in ids]

    @staticmethod
    def from_model(model_id: int) -> bytes:
        """A generated model id -> the byte it stands for (b'' for a special or out-of-range id)."""
        i = int(model_id)
        return bytes([i - OFFSET]) if OFFSET <= i < VOCAB else b""


class StreamDecoder:
    """Bytes in, text out as soon as it is complete UTF-8 (random weights emit any bytes)."""

    def __init__(self):
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, model_id: int) -> str:
        return self._dec.decode(ByteTokenizer.from_model(model_id))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def synthetic_text(n_chars: int, seed: int = 0) -> str:
    """``n_chars`` of deterministic ASCII prose (words chosen by a seeded LCG)."""
    out, x = [], (seed * 2654435761 + 12345) & 0xFFFFFFFF
    size = 0
    while size <= n_chars:
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        w = _WORDS[x % len(_WORDS)]
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def make_prompt(n_tokens: int, seed: int = 0, shared_prefix: int = 0) -> str:
    """Text that encodes to exactly ``n_tokens`` ids (<bos> included).

    The first ``shared_prefix`` tokens (<bos> included) are the same for every seed;
    the rest is seed-specific.
    """
    if n_tokens < 1:
        raise ValueError("a prompt has at least one token (<bos>).")
    shared = min(max(shared_prefix - 1, 0), n_tokens - 1)
    head = synthetic_text(shared, seed=-1)
    m = n_tokens - 1 - shared
    tail = (f"#{seed} " + synthetic_text(m, seed=seed + 1))[:m]  # differs from the first unshared token on
    return head + tail
