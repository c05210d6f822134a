"""`bench` (the repository's top-level package of measurements), importable
by these tests without the repository's root on `sys.path`: the root would
also put the source tree's `keras_largebatch` before the installed one
(which has `applications/` mapped in and the native library). The
processes they start as `python -m bench...` get the root on
`PYTHONPATH` (`bench.environ()`)."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

if "bench" not in sys.modules:
    _init = os.path.join(ROOT, "bench", "__init__.py")
    _spec = importlib.util.spec_from_file_location(
        "bench", _init, submodule_search_locations=[os.path.dirname(_init)])
    sys.modules["bench"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["bench"])
