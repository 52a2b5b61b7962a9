"""The one error type users see: it names what was wrong, what is allowed, what to do.

The CLI prints ``RooflineError`` as a one-line message and exits non-zero; it never
shows a traceback for bad input.
"""


class RooflineError(ValueError):
    """Bad input or an impossible request, with a message fit for a user."""


def did_you_mean(key: str, spellings: dict) -> str:
    """' (did you mean a or b?)' for the names spelled closest to ``key`` (``spellings``: each accepted spelling ->
    the name it stands for; at most three names), or ''. The one "did you mean" of devices and models."""
    import difflib

    close = difflib.get_close_matches(key, list(spellings), n=6, cutoff=0.6)
    names = list(dict.fromkeys(spellings[c] for c in close))[:3]
    return f" (did you mean {' or '.join(names)}?)" if names else ""


def check_positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise RooflineError naming the rule it broke."""
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        isinstance(value, float) and value.is_integer()
    ):
        raise RooflineError(f"{name} must be a whole number, but {value!r} was given.")
    value = int(value)
    low = 0 if allow_zero else 1
    if value < low:
        rule = "zero or more" if allow_zero else "at least 1"
        raise RooflineError(f"{name} must be {rule}, but {value} was given.")
    return value
