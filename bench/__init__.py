"""The measurements of keras-largebatch, run from the repository's root as
modules: `python -m bench.study ...` (the study), `python -m
bench.gpu_campaign ...` (the GPU check), `python -m bench.micro.<name>`
(a micro-benchmark). What each measures and writes: bench/README.md.

A process that starts another bench module (`python -m bench...`) gives it
`environ()`: the repository's root on `PYTHONPATH`, so the child imports
this `bench` wherever it runs.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(module, *args):
    """`python -m module args`, with this interpreter."""
    return [sys.executable, "-m", module, *map(str, args)]


def environ(env=None):
    """`env` (default this process's environment) with the repository's
    root appended to `PYTHONPATH`."""
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ROOT not in paths:
        paths.append(ROOT)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
