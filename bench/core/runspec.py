"""A run spec, its key, its folder, its process and its record.

A run spec is a dict: `workload` (a name in `WORKLOADS`), `kind` (`fixed`,
`grown`, `probe`; the retired LARS study's records have a `phase`),
`optimizer`, `batch` (the update batch; a grown run's first), `rate` (the
peak), `seed`, `epochs`, `warmup_epochs`, and optionally `variant`, `flags`
(the command's other flags; `{work_dir}` in a value is the runs' folder),
`run_backend` (default KERAS_BACKEND's), `micro` (the batch norm batch,
default 256: larger batches accumulate), `evals` (an epoch, default 4),
`limit_seconds` (stopped after them).
A spec with a `program` (a module of `bench/study/`, named by its file:
`kills.py` runs `python -m bench.study.kills`) runs it instead of the
command, with the repository's root on `PYTHONPATH`: given the spec as JSON
and the runs' folder, it writes `result.json` in the run's folder, and
that is its record.
A spec with a `module` is a task (the GPU check's,
`bench/gpu_campaign/plan.py`), named by its `part`, `model`, `optimizer`
and `run_backend`: `python -m <module> SPEC`, the root on `PYTHONPATH`,
prints `RESULT <json>`, its record's `result` (how the pool treats a task:
`pool.py`).
`run_key` names a spec and its run's record alike: a rerun skips what is
done (`finished_keys`); a record short of what its spec implies
(`incomplete`) is not done, and runs again.
"""

import collections
import csv
import json
import math
import os
import sys

import bench

# The study's networks on Fashion-MNIST: the command's flags of each.
_COMMON = dict(dataset="fashion_mnist", weight_decay=5e-4, label_smoothing=0.1,
               bn_momentum=0.9, augment="none", precision="float32")
WORKLOADS = {
    "resnet8_w4": dict(_COMMON, model="resnet_cifar", resnet_depth=8,
                       resnet_width=4),
    "resnet20_w16": dict(_COMMON, model="resnet_cifar", resnet_depth=20,
                         resnet_width=16),
}
MICRO = 256  # The batch norm batch of a spec that names none.
KEY_FIELDS = ("part", "model", "workload", "kind", "phase", "optimizer",
              "epochs", "batch", "rate", "seed", "variant", "epoch_at",
              "steps", "run_backend", "setup", "kill", "fault",
              "jit_compile")


def run_key(spec):
    """'kind|optimizer|epochs|batch|rate|seed[|variant...]': the fields of
    `KEY_FIELDS` the spec (or record) has, the rate to 6 digits; the default
    workload (`resnet8_w4`) is left out, and `phase` where `kind` is set.
    A task's: 'part[|model|optimizer]|run_backend'."""
    parts = []
    for field in KEY_FIELDS:
        value = spec.get(field)
        if value is None or (field == "workload" and value == "resnet8_w4") \
                or (field == "phase" and "kind" in spec):
            continue
        parts.append(f"{value:.6g}" if field == "rate" else str(value))
    return "|".join(parts)


def incomplete(record):
    """Why a training run's record holds less than its spec implies, or
    None: fewer epochs than `epochs`; fewer evaluations than `epochs` x
    the evaluations an epoch (as the record's epoch labels space them,
    most often: the spec's `evals` is overwritten by the list); or, at a
    fixed batch of the study's data (no `steps_per_epoch`), fewer updates
    at the last evaluation than `epochs` x the updates an epoch (its
    micro-batches, the last one partial, over the accumulation steps: 235
    / 16 = 14.6875 at 4,096 on Fashion-MNIST). A task's or a program's
    record: None."""
    if "val_accuracy" not in record or "epochs" not in record:
        return None
    epochs, short = record["epochs"], []
    history = record.get("val_accuracy_per_epoch")
    if history is not None and len(history) < epochs:
        short.append(f"{len(history)} of {epochs} epochs")
    evals = record.get("evals")
    if isinstance(evals, list) and evals:
        labels = [e for e, _, _ in evals]
        gaps = collections.Counter(
            round(b - a, 6) for a, b in zip([0.0] + labels, labels))
        gap = gaps.most_common(1)[0][0]
        planned = epochs * (round(1 / gap) if gap > 0 else 1)
        if len(evals) < planned:
            short.append(f"{len(evals)} of {planned} evaluations")
        if record.get("kind", record.get("phase")) == "fixed" \
                and "steps_per_epoch" not in record.get("flags", {}) \
                and "num_train" in record:
            k = max(1, record["batch"] // record.get("micro", MICRO))
            implied = epochs * math.ceil(
                record["num_train"] / (record["batch"] // k)) / k
            if evals[-1][1] < implied - 1e-3:
                short.append(f"ends at {evals[-1][1]:g} updates of "
                             f"{implied:g}")
    return "; ".join(short) or None


def finished_keys(runs):
    """The keys of `runs` (records) that are done: all but those
    `incomplete` finds short, which run again."""
    return {run_key(r) for r in runs if not incomplete(r)}


def model_dir(spec, work_dir):
    return os.path.join(work_dir, run_key(spec).replace("|", "_"))


def command_line(spec, work_dir, data_dir=""):
    """The `keras-largebatch-train` arguments of one run (no program name)."""
    flags = dict(WORKLOADS[spec.get("workload", "resnet8_w4")])
    micro = spec.get("micro", MICRO)
    flags.update(
        model_dir=model_dir(spec, work_dir), global_batch_size=spec["batch"],
        optimizer=spec["optimizer"], epochs=spec["epochs"],
        warmup_epochs=spec["warmup_epochs"], lr_scaling="none",
        base_learning_rate=spec["rate"], seed=spec["seed"],
        gradient_accumulation_steps=max(1, spec["batch"] // micro),
        evals_per_epoch=spec.get("evals", 4), verbose=0)
    if spec.get("kind") == "grown":
        # The grown batch starts as 2 micro-batches of half the first batch
        # (Keras accumulates from 2 on).
        flags.update(gradient_accumulation_steps=2, adaptive_batch="noise_scale")
    flags.update({name: str(value).format(work_dir=work_dir)
                  for name, value in spec.get("flags", {}).items()})
    if data_dir:
        flags["data_dir"] = data_dir
    return [f"--{name}={value}" for name, value in flags.items()]


def train_command(argv):
    """The process command line of `keras-largebatch-train argv`."""
    return [sys.executable, "-c",
            "from keras_largebatch.train.cli import run; run()", *argv]


def process_command(spec, work_dir, data_dir=""):
    """The process of one run: the spec's task `module` or `program`, else
    the command."""
    if "module" in spec:
        return bench.command(spec["module"], json.dumps(spec))
    if "program" in spec:
        module = "bench.study." + spec["program"].removesuffix(".py")
        return bench.command(module, json.dumps(spec), work_dir)
    return train_command(command_line(spec, work_dir, data_dir))


def collect(spec, directory, wall_seconds):
    """The record of a finished run, from its `summary.json`, `history.csv`
    and `evals.csv`: final and per-epoch accuracy and loss, the
    evaluations within epochs [(epoch, updates, val_accuracy), ...], and a
    grown run's batch and B_simple per epoch and its updates, training
    images/s per epoch (None for an epoch that timed nothing), the wall time
    of the invocation that finished it (`wall_seconds`) and the epochs that
    invocation ran (`epochs_timed`); a program's
    `result.json`; a task's last `RESULT` line (None where it printed
    none)."""
    if "module" in spec:
        with open(os.path.join(directory, "stdout.txt")) as f:
            result = bench.heard(f.read())
        return None if result is None else dict(
            spec, result=result, wall_seconds=round(wall_seconds, 1))
    if "program" in spec:
        with open(os.path.join(directory, "result.json")) as f:
            return dict(spec, **json.load(f),
                        wall_seconds=round(wall_seconds, 1))
    # Here, not at the top: importing the package imports Keras and its
    # backend, seconds a runner (`pool`) need not pay before its first run.
    from keras_largebatch.train import layout

    with open(os.path.join(directory, layout.SUMMARY)) as f:
        summary = json.load(f)
    with open(os.path.join(directory, layout.HISTORY), newline="") as f:
        rows = list(csv.DictReader(f))
    record = dict(
        spec,
        val_accuracy=summary["val_accuracy"],
        val_accuracy_per_epoch=[float(r["val_accuracy"]) for r in rows],
        val_loss_per_epoch=[float(r["val_loss"]) for r in rows],
        train_loss_per_epoch=[float(r["loss"]) for r in rows],
        best_val_accuracy=max(float(r["val_accuracy"]) for r in rows),
        # None where the epoch timed nothing (`NA`: it resumed at its
        # last step, `outputs.callbacks.HistoryCSV`).
        images_per_sec_per_epoch=[
            None if r["images_per_sec"] == "NA" else float(r["images_per_sec"])
            for r in rows],
        num_train=summary["num_train"], backend=summary["backend"],
        updates=summary.get("updates"), wall_seconds=round(wall_seconds, 1),
        # The epochs the timed (last) invocation ran: fewer than the run's
        # where it resumed, and then `wall_seconds` times only that part.
        epochs_timed=summary.get("epochs_run_now"))
    if rows and "global_batch_size" in rows[0]:
        record["batch_per_epoch"] = [int(float(r["global_batch_size"]))
                                     for r in rows]
    if rows and "gradient_noise_scale" in rows[0]:
        record["noise_scale_per_epoch"] = [
            float(r["gradient_noise_scale"] or "nan") for r in rows]
    evals = os.path.join(directory, layout.EVALS)
    if os.path.exists(evals):
        with open(evals, newline="") as f:
            record["evals"] = [[float(r["epoch"]), float(r["updates"]),
                                float(r["val_accuracy"])]
                               for r in csv.DictReader(f)]
    return record
