"""Converts the GPU check's records in the campaign's old form (each part a
dict of `results` and `failed` by name, part cuda one dict; written until
2026-11-28, before the study's runner ran the check) into the runner's
(`runs` and `failed`, each a task's spec with its result or error, its
machine stamp taken from the call that ran it), in place:

    python -m bench.gpu_campaign.convert bench/results/gpu_campaign.json

The report (`report.py`) renders a converted record as it rendered the old
one; the other fields (the calls, part c's summary) are kept.
"""

import datetime
import json
import sys

from bench.study import gpu_check

OLD_PARTS = ("compiled", "a", "b", "cuda")
NAMES = {"jax": "JAX", "torch": "torch"}


def machine(sessions, finished, backend):
    """The runner's stamp of a task that ended at `finished`, from the
    call that ran it (the last one started before)."""
    end = datetime.datetime.fromisoformat(finished)
    call = [s for s in sessions
            if datetime.datetime.fromisoformat(s["started"]) <= end][-1]
    gpu = (call["gpu"] or "").split(",")[0]
    where = f"one {gpu}" if gpu else call["host"]
    return (f"{where} ({NAMES[backend]} {call['versions'][backend]}), "
            f"{end.date().isoformat()}")


def spec(part, name, settings, smoke):
    """The task spec of part `part`'s item `name` ('backend|model|optimizer
    [|compiled]', part b's: its backend)."""
    task = dict(part=part, module=gpu_check.TASKS)
    if part == "b":
        task.update(run_backend=name)
    elif part != "cuda":
        task.update(zip(("run_backend", "model", "optimizer"),
                        name.split("|")[:3]))
    if part == "cuda":
        return dict(task, arch=gpu_check.CUDA_ARCH, smoke=smoke)
    return dict(task, settings=settings, smoke=smoke)


def convert(old):
    """The runner's record of an old one."""
    smoke, sessions = old.get("smoke", False), old.get("sessions", [])
    runs, failed = [], []
    for part in OLD_PARTS[:3]:
        store = old.get(part) or {}
        for name, r in store.get("results", {}).items():
            task = spec(part, name, store["settings"], smoke)
            result = {k: v for k, v in r.items()
                      if k not in ("seconds", "finished")}
            runs.append(dict(task, result=result, wall_seconds=r["seconds"],
                             machine=machine(sessions, r["finished"],
                                             task["run_backend"]),
                             finished=r["finished"]))
        for name, r in store.get("failed", {}).items():
            task = spec(part, name, store["settings"], smoke)
            failed.append(dict(task, error=r["error"], machine=machine(
                sessions, r["finished"], task["run_backend"]),
                finished=r["finished"]))
    cuda = old.get("cuda")
    if cuda:
        task = spec("cuda", "", None, smoke)
        stamp = machine(sessions, cuda.get("finished", sessions[-1][
            "started"]), "jax")
        if cuda.get("skipped"):
            runs.append(dict(task, result=dict(skipped=True), machine=stamp,
                             finished=sessions[-1]["started"]))
        elif cuda["passed"]:
            took = (datetime.datetime.fromisoformat(cuda["finished"])
                    - datetime.datetime.fromisoformat(cuda["started"]))
            runs.append(dict(task, result={
                k: cuda[k] for k in ("command", "returncode", "summary",
                                     "passed", "compile_only")},
                wall_seconds=took.total_seconds(), machine=stamp,
                finished=cuda["finished"]))
        else:
            failed.append(dict(task, error=cuda["summary"], machine=stamp,
                               finished=cuda["finished"]))
    rest = {k: v for k, v in old.items() if k not in OLD_PARTS}
    return dict(rest, failed=sorted(failed, key=lambda r: r["finished"]),
                runs=sorted(runs, key=lambda r: r["finished"]))


def main(paths):
    from keras_largebatch._shared import atomic_write

    for path in paths:
        with open(path) as f:
            old = json.load(f)
        if not any(part in old for part in OLD_PARTS):
            print(f"{path}: already the runner's")
            continue
        new = convert(old)
        atomic_write(path, json.dumps(new, indent=1))
        print(f"{path}: {len(new['runs'])} runs, {len(new['failed'])} failed")


if __name__ == "__main__":
    main(sys.argv[1:])
