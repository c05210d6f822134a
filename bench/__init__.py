"""The measurements of keras-largebatch, run from the repository's root as
modules: `python -m bench.study ...` (the study), `python -m
bench.gpu_campaign ...` (the GPU check), `python -m bench.micro.<name>`
(a micro-benchmark). What each measures and writes: bench/README.md.

A process that starts another bench module (`python -m bench...`) gives it
`environ()`: the repository's root on `PYTHONPATH`, so the child imports
this `bench` wherever it runs; a child that measures something prints it as
its last `RESULT <json>` line (`say`, read by `heard`).
"""

import json
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


def say(value):
    """Prints `value` as a child's `RESULT <json>` line."""
    print("RESULT " + json.dumps(value), flush=True)


def heard(stdout):
    """The value of the last `RESULT <json>` line of a child's `stdout`;
    None where it printed none."""
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None
