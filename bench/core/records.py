"""A record file, `bench/results/<name>.json`: each finished run (`runs`;
a retired study's `probes`), failed task (`failed`) and run found short
and run again (`incomplete`: `runspec.incomplete`) with its machine stamp,
and fields of its own; written atomically, so a kill mid-write keeps the
last one."""

import json
import os

import bench
from bench.core import runspec

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
    return data.get("runs", [])


def failures(path):
    """A record file's failed tasks, each its spec with its `error`."""
    return read(path).get("failed", [])


def incomplete(path):
    """A record file's runs found short and replaced by a rerun (`add`)."""
    return read(path).get("incomplete", [])


def add(path, run, **about):
    """Adds `run` to the record at `path` (`save`, `about` added); a run
    there of the same key that is short (`runspec.incomplete`: the run
    `run` ran again) moves to the record's `incomplete` list, kept beside
    the runs, so that a key names one run."""
    key = runspec.run_key(run)
    runs = load(path)
    replaced = [r for r in runs
                if runspec.run_key(r) == key and runspec.incomplete(r)]
    if replaced:
        about = dict(about, incomplete=incomplete(path) + replaced)
    save(path, [r for r in runs if not any(r is x for x in replaced)]
         + [run], **about)


def save(path, runs, **about):
    """Writes the record atomically (a kill mid-write keeps the last one),
    its other fields kept and `about` added."""
    # Here, not at the top: importing the package imports Keras and its
    # backend, seconds a runner (`pool`) need not pay before its first run.
    from keras_largebatch._shared import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record = {k: v for k, v in read(path).items() if k != "runs"}
    atomic_write(path, json.dumps(dict(record, **about, runs=runs), indent=1))
