"""What the CLI tests check of a refused command: one `error:` line on stderr, no traceback."""

from __future__ import annotations


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]
