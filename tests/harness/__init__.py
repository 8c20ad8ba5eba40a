"""Verification tooling beside the tests: the randomized audit, the drain, the wait scenarios.

Run from a checkout with ``python -m tests.harness --help``; the test suite smoke-runs each.
"""
