"""``python -m tests.harness``: the verification harness's commands."""

from tests.harness.cli import main

main()
