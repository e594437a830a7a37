"""Benchmarks: ``core`` (the engine alone) and ``kafka`` (the worker end to end on a real broker)."""
