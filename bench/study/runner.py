"""The one runner of every study: a run spec's command line, a pool of
processes within a time budget, one record writer with one machine stamp.

A run spec is a dict: `workload` (a name in `WORKLOADS`), `kind` (`fixed`,
`grown`, `probe`; the retired LARS study's records have a `phase`),
`optimizer`, `batch` (the update batch; a grown run's first), `rate` (the
peak), `seed`, `epochs`, `warmup_epochs`, and optionally `variant`, `flags`
(the command's other flags; `{work_dir}` in a value is the runs' folder),
`run_backend` (default KERAS_BACKEND's), `micro` (the batch norm batch,
default 256: larger batches accumulate), `evals` (an epoch, default 4).
A spec with a `program` (a module beside this file, named by its file:
`kills.py` runs `python -m bench.study.kills`) runs it instead of the
command, with the repository's root on `PYTHONPATH`: given the spec as JSON
and the runs' folder, it writes `result.json` in the run's folder, and
that is its record.
`run_key` names a spec and its run's record alike: a rerun skips what is
done. A record (`<plan>.json`) holds each finished run with its machine.
"""

import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata

import bench
from keras_largebatch._shared import atomic_write

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(BENCH, "results")

# The study's networks on Fashion-MNIST: the command's flags of each.
_COMMON = dict(dataset="fashion_mnist", weight_decay=5e-4, label_smoothing=0.1,
               bn_momentum=0.9, augment="none", precision="float32")
WORKLOADS = {
    "resnet8_w4": dict(_COMMON, model="resnet_cifar", resnet_depth=8,
                       resnet_width=4),
    "resnet20_w16": dict(_COMMON, model="resnet_cifar", resnet_depth=20,
                         resnet_width=16),
}
KEY_FIELDS = ("workload", "kind", "phase", "optimizer", "epochs", "batch",
              "rate", "seed", "variant", "epoch_at", "steps", "run_backend",
              "setup", "kill", "fault")


def run_key(spec):
    """'kind|optimizer|epochs|batch|rate|seed[|variant...]': the fields of
    `KEY_FIELDS` the spec (or record) has, the rate to 6 digits; the default
    workload (`resnet8_w4`) is left out, and `phase` where `kind` is set."""
    parts = []
    for field in KEY_FIELDS:
        value = spec.get(field)
        if value is None or (field == "workload" and value == "resnet8_w4") \
                or (field == "phase" and "kind" in spec):
            continue
        parts.append(f"{value:.6g}" if field == "rate" else str(value))
    return "|".join(parts)


def model_dir(spec, work_dir):
    return os.path.join(work_dir, run_key(spec).replace("|", "_"))


def command_line(spec, work_dir, data_dir=""):
    """The `keras-largebatch-train` arguments of one run (no program name)."""
    flags = dict(WORKLOADS[spec.get("workload", "resnet8_w4")])
    micro = spec.get("micro", 256)
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
            "from keras_largebatch.train.main import run; run()", *argv]


def process_command(spec, work_dir, data_dir=""):
    """The process of one run: the spec's `program`, else the command."""
    if "program" in spec:
        module = "bench.study." + spec["program"].removesuffix(".py")
        return bench.command(module, json.dumps(spec), work_dir)
    return train_command(command_line(spec, work_dir, data_dir))


def version(package):
    """The installed version of `package`; None where it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def nvidia_smi(query="name"):
    """nvidia-smi's answer to `--query-gpu=<query>`, a line a GPU ("" where
    there is none)."""
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")


def machine(backend=None):
    """'2-core x86_64 CPU VM, no GPU (JAX 0.10.2), 2026-11-27', or 'one
    NVIDIA H200 (JAX 0.11.2), 2026-11-27': where runs of `backend` (default
    KERAS_BACKEND's) run from this process."""
    backend = backend or os.environ.get("KERAS_BACKEND", "jax")
    packages = {"tensorflow": ("tensorflow", "tensorflow-cpu")}.get(
        backend, (backend,))
    found = next(filter(None, map(version, packages)), "?")
    name = {"jax": "JAX", "torch": "torch", "tensorflow": "TensorFlow"}
    software = f"{name.get(backend, backend)} {found}"
    gpu = nvidia_smi()
    where = (f"one {gpu.splitlines()[0]}" if gpu else
             f"{os.cpu_count()}-core {platform.machine()} CPU VM, no GPU")
    return f"{where} ({software}), {datetime.date.today().isoformat()}"


def machine_kind(stamp):
    """The kind of machine and backend a stamp names: 'H100 / JAX',
    'H200 / JAX', 'CPU VM / TensorFlow', ...: arms are compared within one."""
    kind = next((k for k in ("H200", "H100") if k in (stamp or "")), "CPU VM")
    backend = next((b for b in ("JAX", "torch", "TensorFlow")
                    if f"({b} " in (stamp or "")), "JAX")
    return f"{kind} / {backend}"


def collect(spec, directory, wall_seconds):
    """The record of a finished run, from its `summary.json`, `history.csv`
    and `evals.csv`: final and per-epoch accuracy and loss, the
    evaluations within epochs [(epoch, updates, val_accuracy), ...], and a
    grown run's batch and B_simple per epoch and its updates; a program's
    `result.json`."""
    if "program" in spec:
        with open(os.path.join(directory, "result.json")) as f:
            return dict(spec, **json.load(f),
                        wall_seconds=round(wall_seconds, 1))
    with open(os.path.join(directory, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(directory, "history.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    record = dict(
        spec,
        val_accuracy=summary["val_accuracy"],
        val_accuracy_per_epoch=[float(r["val_accuracy"]) for r in rows],
        val_loss_per_epoch=[float(r["val_loss"]) for r in rows],
        train_loss_per_epoch=[float(r["loss"]) for r in rows],
        best_val_accuracy=max(float(r["val_accuracy"]) for r in rows),
        images_per_sec_per_epoch=[float(r["images_per_sec"]) for r in rows],
        num_train=summary["num_train"], backend=summary["backend"],
        updates=summary.get("updates"), wall_seconds=round(wall_seconds, 1))
    if rows and "global_batch_size" in rows[0]:
        record["batch_per_epoch"] = [int(float(r["global_batch_size"]))
                                     for r in rows]
    if rows and "gradient_noise_scale" in rows[0]:
        record["noise_scale_per_epoch"] = [
            float(r["gradient_noise_scale"] or "nan") for r in rows]
    evals = os.path.join(directory, "evals.csv")
    if os.path.exists(evals):
        with open(evals, newline="") as f:
            record["evals"] = [[float(r["epoch"]), float(r["updates"]),
                                float(r["val_accuracy"])]
                               for r in csv.DictReader(f)]
    return record


def load(path):
    """A record file's runs ([] when there is none yet)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        data = json.load(f)
    return data.get("runs", data.get("probes", []))


def save(path, runs, **about):
    """Writes the record atomically (a kill mid-write keeps the last one),
    its other fields kept and `about` added."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record = {}
    if os.path.exists(path):
        with open(path) as f:
            record = {k: v for k, v in json.load(f).items()
                      if k not in ("runs", "probes")}
    atomic_write(path, json.dumps(dict(record, **about, runs=runs), indent=1))


def run(specs, record_path, work_dir, workers=2, budget=0.0, data_dir="",
        log=print, env=None):
    """Runs the specs not yet in the record, `workers` processes at a time,
    in order. `specs` is a list, or a function of the record's runs
    returning one (a plan's `all_specs`): asked again after each finished
    run, so that runs waiting on others (a sweep's best rate) start as soon
    as they can. With `budget` (seconds) no run starts after it has passed
    and runs still going at its end are stopped (their epoch checkpoints
    let a rerun resume them). A failed run is logged with its stderr's last
    line and not started again by this call. The processes start from `env`
    (default this one's environment). Returns the runs finished by
    this call."""
    plan = specs if callable(specs) else (lambda runs: specs)
    deadline = time.monotonic() + budget if budget else float("inf")
    busy, finished, tried = {}, [], set()

    def todo(runs):
        done = {run_key(r) for r in runs} | tried
        return [s for s in plan(runs) if run_key(s) not in done]

    waiting = todo(load(record_path))
    while waiting or busy:
        while waiting and len(busy) < workers and time.monotonic() < deadline:
            spec = waiting.pop(0)
            tried.add(run_key(spec))
            directory = model_dir(spec, work_dir)
            os.makedirs(directory, exist_ok=True)
            err = open(os.path.join(directory, "stderr.txt"), "w")
            own = dict(os.environ if env is None else env,
                       **({"KERAS_BACKEND": spec["run_backend"]}
                          if "run_backend" in spec else {}))
            if "program" in spec:
                own = bench.environ(own)
            proc = subprocess.Popen(
                process_command(spec, work_dir, data_dir),
                stdout=subprocess.DEVNULL, stderr=err, env=own)
            busy[proc] = (spec, time.monotonic(), err)
            log(f"start {run_key(spec)}")
        if time.monotonic() >= deadline:
            waiting = []
        time.sleep(1)
        for proc in list(busy):
            spec, started, err = busy[proc]
            if proc.poll() is None and time.monotonic() < deadline:
                continue
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            busy.pop(proc)
            err.close()
            key, directory = run_key(spec), model_dir(spec, work_dir)
            if proc.returncode:
                with open(os.path.join(directory, "stderr.txt")) as f:
                    tail = (f.read().strip().splitlines() or ["?"])[-1]
                log(f"stopped {key} (exit {proc.returncode}): {tail}")
                continue
            record = dict(collect(spec, directory, time.monotonic() - started),
                          machine=machine(spec.get("run_backend")),
                          host=platform.node(), finished=now())
            runs = load(record_path) + [record]
            save(record_path, runs, updated=datetime.date.today().isoformat())
            finished.append(record)
            log(f"done {key}" + (f": val {record['val_accuracy']:.4f}"
                                 if "val_accuracy" in record else ""))
            if time.monotonic() < deadline:
                waiting = todo(runs)
    return finished
