"""What a CLI test asserts of a refusal: exit status 2 and one line, "Error: ...", holding the given words."""


def one_line_error(res, *words) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
