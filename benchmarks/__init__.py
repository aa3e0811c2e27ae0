"""Benchmarks: ratios measured side by side in one run (never asserted in tests). `python -m benchmarks`."""
