"""The bench scripts, imported by their paths (bench/ is not a package)."""

import importlib.util
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench")


def load_bench(name, as_name=None):
    """`bench/<name>.py` as a module (`as_name`: the name it is given),
    with bench/ on the path for the modules it imports."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    spec = importlib.util.spec_from_file_location(
        as_name or name, os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench_module():
    """`load_bench`, for the tests' module fixtures."""
    return load_bench
