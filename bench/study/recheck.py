"""A recorded run's first epochs again, at the code checked out now, compared
epoch by epoch with its record (issue 60): does a record still describe
what this code does?

    python -m bench.study recheck depth 'resnet20_w16|fixed|lars_mixed|12|4096|5|101' --epochs 2

The run's own command line (`runspec.command_line` of its plan's spec) runs in a
fresh folder until its `history.csv` holds `--epochs` rows, then is
stopped: the schedule is the recorded run's, not one of fewer epochs.
Bit-identical reruns hold on one processor model and backend (not across
CPU models, which one machine kind may span), so the rows also give the
record's machine, commit, processor and boot (`provenance.processor`,
stamped since 2026-11-29 midday). Each recheck is kept in
`bench/results/rechecks.json` (`record`), which the study's page lists."""

import csv
import math
import os
import shlex
import time

from bench.core import pool
from bench.core import provenance
from bench.core import records
from bench.core import runspec
from keras_largebatch.train import layout


def find(plan, key, results=records.RESULTS):
    """(spec, run): the spec of `plan` (a `Plan` of `engine.PLANS`) whose
    `runspec.run_key` is `key`, and its run in the plan's record; a
    `ValueError` naming the key when either is missing. The command line
    comes from the spec (a record's `evals` holds the evaluations, not the
    spec's count)."""
    runs = records.load(plan.path(results))
    run = next((r for r in runs if runspec.run_key(r) == key), None)
    spec = next((s for s in plan.all_specs(runs)
                 if runspec.run_key(s) == key), None)
    if run is None or spec is None:
        raise ValueError(f"no recorded run `{key}` of the plan `{plan.name}` "
                         f"in {plan.path(results)}. Received: key={key!r}")
    return spec, run


def _rows(directory):
    path = os.path.join(directory, layout.HISTORY)
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def rerun(spec, run, epochs, work_dir, env=None, poll=1.0, timeout=None):
    """The first `epochs` rows of `history.csv` of `spec` run again under
    `work_dir` (a fresh folder: an old one would be resumed) on the
    backend of its record `run`; the process is stopped once they are
    written."""
    directory = runspec.model_dir(spec, work_dir)
    if os.path.exists(os.path.join(directory, layout.HISTORY)):
        raise ValueError(f"`work_dir` already holds this run: {directory} "
                         "would be resumed, not rerun. Received: "
                         f"work_dir={work_dir!r}")
    own = dict(os.environ if env is None else env)
    backend = spec.get("run_backend") or run.get("backend")
    if backend:
        own["KERAS_BACKEND"] = backend
    began = time.monotonic()
    proc = pool.start(spec, work_dir, env=own)
    try:
        while len(_rows(directory)) < epochs and proc.poll() is None:
            if timeout and time.monotonic() - began > timeout:
                break
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            pool.stop(proc, False)
    rows = _rows(directory)[:epochs]
    if len(rows) < epochs:
        said = (pool.stderr(directory).splitlines() or ["?"])[-1]
        raise RuntimeError(f"the rerun wrote {len(rows)} of {epochs} epochs: "
                           f"{said}")
    return rows


def compare(run, rows):
    """[{epoch, field, recorded, now, difference}] of the validation
    accuracy and loss and the training loss of each epoch of `rows`."""
    fields = (("val_accuracy", "val_accuracy_per_epoch"),
              ("val_loss", "val_loss_per_epoch"),
              ("loss", "train_loss_per_epoch"))
    out = []
    for epoch, row in enumerate(rows):
        for column, recorded in fields:
            old, new = run[recorded][epoch], float(row[column])
            out.append(dict(epoch=epoch, field=column, recorded=old, now=new,
                            difference=new - old))
    return out


def lines(run, compared):
    """The table and one line of verdict: identical, or the largest
    difference; with the record's machine and commit against this tree's."""
    code = run.get("code") or {}
    here = provenance.code(run.get("run_backend") or run.get("backend"))
    cpu = provenance.processor()
    out = [f"record: {run.get('machine', '?')}, commit "
           f"{code.get('commit') or 'not recorded'}"
           + (" (dirty)" if code.get("dirty") else "")
           + f"; cpu {run.get('cpu') or 'not recorded'}, boot "
           f"{run.get('boot') or 'not recorded'}",
           f"now:    {provenance.machine(run.get('run_backend') or run.get('backend'))}"
           f", commit {here['commit'] or '?'}"
           + (" (dirty)" if here["dirty"] else "")
           + f"; cpu {cpu['cpu'] or '?'}, boot {cpu['boot'] or '?'}", "",
           "| epoch | field | recorded | now | now - recorded |",
           "|---|---|---|---|---|"]
    out += [f"| {c['epoch']} | {c['field']} | {c['recorded']:.6g} | "
            f"{c['now']:.6g} | {c['difference']:+.3g} |" for c in compared]
    worst = max(compared, key=lambda c: abs(c["difference"]))
    same = all(c["difference"] == 0 for c in compared)
    out += ["", "identical to the record, epoch by epoch" if same else
            f"differs: largest {worst['field']} of epoch {worst['epoch']}, "
            f"{worst['difference']:+.3g}"
            + ("" if math.isfinite(worst["difference"]) else " (not finite)")]
    return out


def result(plan, key, run, compared, epochs):
    """A recheck's record: the run (`plan`, `key`), the record's machine
    and commit, this rerun's stamp (machine, host, time, code), its
    command, each compared value and whether all are identical."""
    code = run.get("code") or {}
    backend = run.get("run_backend") or run.get("backend")
    return dict(
        plan=plan, key=key, epochs=epochs,
        recorded=dict(machine=run.get("machine"), commit=code.get("commit"),
                      dirty=bool(code.get("dirty")), cpu=run.get("cpu"),
                      boot=run.get("boot")),
        **provenance.stamp({"run_backend": backend}),
        command=(f"python -m bench.study recheck {plan} {shlex.quote(key)} "
                 f"--epochs {epochs}"),
        identical=all(c["difference"] == 0 for c in compared),
        compared=compared)


def record(found, results=records.RESULTS):
    """Adds `found` (a `result`) to `rechecks.json` under `results`;
    returns its path."""
    path = os.path.join(results, "rechecks.json")
    records.save(path, records.load(path) + [found])
    return path
