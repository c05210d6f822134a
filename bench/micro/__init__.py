"""Micro-benchmarks, one per measured speed claim, each run as
`python -m bench.micro.<name>` from the repository's root.

One option style (`parser`): `--out PATH`, the record (default
`bench/results/<name>.json`), and multi-word options with underscores.
Every record names its machine, date and command (`stamp`, from
`bench/core/provenance.py`) and is written atomically (`write`). Nothing
here imports Keras: a benchmark chooses its backend first; one that
measures several backends runs each in a child process of its own
(`child`), one that measures a job of several processes starts them on
loopback (`workers`)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import bench
from bench.core import provenance


def parser(doc, name):
    """An argument parser described by `doc`'s first line, with `--out`
    (default `bench/results/<name>.json`; `name` None: no default)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", default=name and os.path.join(
        bench.ROOT, "bench", "results", name + ".json"),
                   help=f"the record's path (default: bench/results/{name}"
                        ".json)" if name else "the record's path")
    return p


def stamp(name, backends=None):
    """A record's `machine` (`provenance.machine` of the first of
    `backends`, default KERAS_BACKEND's), `date`, `command` (its paths in
    the repository relative to its root) and, for
    several backends, each one's framework `versions`."""
    backends = list(backends or [None])
    # Paths in the repository as from its root, as the command is run.
    argv = [a.replace(bench.ROOT + os.sep, "") for a in sys.argv[1:]]
    out = dict(machine=provenance.machine(backends[0]), date=provenance.now(),
               command=" ".join([f"python -m bench.micro.{name}", *argv]))
    if len(backends) > 1:
        out["versions"] = {b: provenance.framework_version(b)
                           for b in backends}
    return out


def write(path, record, indent=2):
    """`record` as JSON at `path`, atomically; says where."""
    from keras_largebatch._shared import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(record, indent=indent))
    print(f"\nwrote {path}")


def child(module, backend, *args, timeout=None):
    """What `python -m bench.micro.<module> args`, run on `backend` in a
    process of its own, says (`bench.say`); its stderr's end where it
    fails."""
    env = bench.environ(dict(os.environ, KERAS_BACKEND=backend,
                             TF_CPP_MIN_LOG_LEVEL="3"))
    proc = subprocess.run(bench.command(f"bench.micro.{module}", *args),
                          env=env, capture_output=True, text=True,
                          timeout=timeout)
    result = bench.heard(proc.stdout)
    if proc.returncode or result is None:
        raise RuntimeError(f"bench.micro.{module} on {backend} failed:\n"
                           f"{proc.stderr[-3000:]}")
    return result


def workers(module, backend, count, args, timeout, **env):
    """What `count` processes of `python -m bench.micro.<module>` on
    loopback (`localhost.run`), on `backend` with `env`, wrote: each is
    given `args(out)`, `out` the JSON file it writes."""
    from keras_largebatch.distribute import localhost

    tmp = tempfile.mkdtemp(prefix=f"bench_{module}_")
    outs = [os.path.join(tmp, f"{i}.json") for i in range(count)]
    env = bench.environ(dict(os.environ, KERAS_BACKEND=backend, **env))
    codes = localhost.run([bench.command(f"bench.micro.{module}", *args(out))
                           for out in outs], timeout, env=env)
    if any(codes):
        raise RuntimeError(f"{backend} workers failed: {codes}")
    result = []
    for out in outs:
        with open(out) as f:
            result.append(json.load(f))
    return result
