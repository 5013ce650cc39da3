"""Benchmarks for sandboxd (run as modules, e.g. ``python -m benchmarks.acquire_exec``)."""
