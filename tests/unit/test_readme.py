"""The README's library example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def program() -> str:
    text = README.read_text("utf-8")
    section = text[text.index("## In a program"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README's 'In a program' section has no Python block"
    return match.group(1)


def test_the_readme_library_example_runs_as_written():
    result = subprocess.run([sys.executable, "-W", "error", "-c", program()],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
