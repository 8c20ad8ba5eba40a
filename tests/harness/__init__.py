"""Verification tooling beside the tests: the randomized audit, the drain, the wait scenarios.

Run from a checkout with ``python -m tests.harness --help``; the test suite smoke-runs each.

``children`` is the one way the harness and the tests start processes (any command, or a
child running the store steps of ``steps``), with no process outliving its starter.
"""
