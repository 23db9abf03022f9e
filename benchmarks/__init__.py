"""The project's own benchmarks: each module runs with python -m benchmarks.<name>."""
