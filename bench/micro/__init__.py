"""Micro-benchmarks, one per measured speed claim, each run as
`python -m bench.micro.<name>` from the repository's root.

One option style (`parser`): `--out PATH`, the record (default
`bench/results/<name>.json`), and multi-word options with underscores.
Every record names its machine, date and command (`stamp`, from
`bench/core/provenance.py`) and is written atomically (`write`). Nothing
here imports Keras: a benchmark chooses its backend first."""

import argparse
import json
import os
import sys

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
    `backends`, default KERAS_BACKEND's), `date`, `command` and, for
    several backends, each one's framework `versions`."""
    backends = list(backends or [None])
    out = dict(machine=provenance.machine(backends[0]), date=provenance.now(),
               command=" ".join([f"python -m bench.micro.{name}",
                                 *sys.argv[1:]]))
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
