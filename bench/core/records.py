"""A record file, `bench/results/<name>.json`: each finished run (`runs`;
a retired study's `probes`) and failed task (`failed`) with its machine
stamp, and fields of its own; written atomically, so a kill mid-write keeps
the last one."""

import json
import os

import bench
from keras_largebatch._shared import atomic_write

RESULTS = os.path.join(bench.ROOT, "bench", "results")


def read(path):
    """A record file's fields ({} when there is none yet)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def load(path):
    """A record file's runs ([] when there is none yet)."""
    data = read(path)
    return data.get("runs", data.get("probes", []))


def failures(path):
    """A record file's failed tasks, each its spec with its `error`."""
    return read(path).get("failed", [])


def save(path, runs, **about):
    """Writes the record atomically (a kill mid-write keeps the last one),
    its other fields kept and `about` added."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record = {k: v for k, v in read(path).items()
              if k not in ("runs", "probes")}
    atomic_write(path, json.dumps(dict(record, **about, runs=runs), indent=1))
