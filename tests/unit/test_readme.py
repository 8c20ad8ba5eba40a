"""The README's library examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

#: The sections whose first Python block is a whole program.
SECTIONS = ["## In a program", "## Scheduling and flow control"]


def program(heading: str) -> str:
    text = README.read_text("utf-8")
    section = text[text.index(heading):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, f"the README's {heading!r} section has no Python block"
    return match.group(1)


@pytest.mark.parametrize("heading", SECTIONS)
def test_the_readme_example_runs_as_written(heading: str) -> None:
    result = subprocess.run([sys.executable, "-W", "error", "-c", program(heading)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
