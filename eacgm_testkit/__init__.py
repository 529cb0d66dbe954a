"""The lab's test and demo kit: helpers for tests, benchmarks and examples/demo.py.

Never shipped: pyproject's package list leaves it out of the wheel, so nothing in otel_eacgm or
eacgm_detector may import it. It is importable from the repository root (pytest's pythonpath,
and the scripts put the root on sys.path).
"""
