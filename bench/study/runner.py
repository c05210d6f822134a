"""The one runner of every study and of the GPU check: a run spec's
process, a pool of processes within a time budget, one record writer with
one machine stamp.

A run spec is a dict: `workload` (a name in `WORKLOADS`), `kind` (`fixed`,
`grown`, `probe`; the retired LARS study's records have a `phase`),
`optimizer`, `batch` (the update batch; a grown run's first), `rate` (the
peak), `seed`, `epochs`, `warmup_epochs`, and optionally `variant`, `flags`
(the command's other flags; `{work_dir}` in a value is the runs' folder),
`run_backend` (default KERAS_BACKEND's), `micro` (the batch norm batch,
default 256: larger batches accumulate), `evals` (an epoch, default 4),
`limit_seconds` (stopped after them).
A spec with a `program` (a module beside this file, named by its file:
`kills.py` runs `python -m bench.study.kills`) runs it instead of the
command, with the repository's root on `PYTHONPATH`: given the spec as JSON
and the runs' folder, it writes `result.json` in the run's folder, and
that is its record.
A spec with a `module` is a task (the GPU check's, `gpu_check.py`), named
by its `part`, `model`, `optimizer` and `run_backend`: `python -m <module>
SPEC`, the root on `PYTHONPATH`, prints `RESULT <json>`, its record's
`result`. A task does not resume, so one that fails or runs past its
`limit_seconds` is recorded under `failed` with its error, and no call
starts it again; none starts once one is expected to end after the budget
(taking as long as the longest of its part and backend in this call); and
one that exits `NO_GPU` stops the call (`NoGPU`).
A spec whose `run_backend` is not installed is said once a call and left
for a call where it is.
`run_key` names a spec and its run's record alike: a rerun skips what is
done. A record (`<plan>.json`) holds each finished run (`runs`) and failed
task (`failed`) with its machine.
"""

import collections
import csv
import datetime
import importlib.util
import json
import os
import platform
import signal
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
KEY_FIELDS = ("part", "model", "workload", "kind", "phase", "optimizer",
              "epochs", "batch", "rate", "seed", "variant", "epoch_at",
              "steps", "run_backend", "setup", "kill", "fault")
NO_GPU = 3  # A task's exit status: no GPU where it needs one.
POLL = 1.0  # Seconds between looks at the running processes.


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
    """The process of one run: the spec's task `module` or `program`, else
    the command."""
    if "module" in spec:
        return bench.command(spec["module"], json.dumps(spec))
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


def framework_version(backend):
    """The installed version of a Keras backend's framework (None)."""
    packages = {"tensorflow": ("tensorflow", "tensorflow-cpu")}.get(
        backend, (backend,))
    return next(filter(None, map(version, packages)), None)


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
    found = framework_version(backend) or "?"
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
    `result.json`; a task's last `RESULT` line (None where it printed
    none)."""
    if "module" in spec:
        with open(os.path.join(directory, "stdout.txt")) as f:
            lines = [x for x in f.read().splitlines()
                     if x.startswith("RESULT ")]
        return dict(spec, result=json.loads(lines[-1][len("RESULT "):]),
                    wall_seconds=round(wall_seconds, 1)) if lines else None
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


class NoGPU(SystemExit):
    """A task found no GPU where it needs one: the call stops (a GPU
    machine that sees none would spend its time measuring nothing)."""


def installed(backend):
    """Whether the package of `backend` (a Keras backend) is here."""
    return importlib.util.find_spec(backend) is not None


def _git(*args):
    """git's output in the repository of this `bench` ("" where it fails)."""
    try:
        return subprocess.run(["git", "-C", bench.ROOT, *args],
                              capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


_CODE = {}


def code(backend=None):
    """The code a run ran: the commit of this tree (None outside git),
    `dirty` (tracked files changed outside `bench/results/`, which the
    runner itself writes), and the versions of the package, Keras and
    `backend`'s framework. Read once a process: a study runs from a tree
    that does not change under it."""
    backend = backend or os.environ.get("KERAS_BACKEND", "jax")
    if "commit" not in _CODE:
        commit = _git("rev-parse", "HEAD") or None
        changed = _git("status", "--porcelain", "--untracked-files=no",
                       "--", ".", ":(exclude)bench/results")
        _CODE.update(commit=commit, dirty=bool(commit and changed))
    return dict(_CODE, versions={
        "keras-largebatch": version("keras-largebatch"),
        "keras": version("keras"), backend: framework_version(backend)})


def stamp(spec):
    """Where, when and with what code a run ended: its machine
    (`machine`), host, time, and `code`."""
    backend = spec.get("run_backend")
    return dict(machine=machine(backend), host=platform.node(),
                finished=now(), code=code(backend))


def _start(spec, work_dir, data_dir, env):
    """The process of `spec`, its stderr (and a task's stdout) in the run's
    folder; a task in a process group of its own, stopped whole."""
    directory = model_dir(spec, work_dir)
    os.makedirs(directory, exist_ok=True)
    own = dict(os.environ if env is None else env,
               **({"KERAS_BACKEND": spec["run_backend"]}
                  if "run_backend" in spec else {}))
    task = "module" in spec
    if task or "program" in spec:
        own = bench.environ(own)
    with open(os.path.join(directory, "stderr.txt"), "w") as err, \
            open(os.path.join(directory, "stdout.txt") if task
                 else os.devnull, "w") as out:
        return subprocess.Popen(process_command(spec, work_dir, data_dir),
                                stdout=out, stderr=err, env=own,
                                start_new_session=task)


def _stop(proc, group):
    """Stops a process (`group`: with its process group), killed where it
    has not ended 30 s after being asked to."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def _stderr(directory):
    with open(os.path.join(directory, "stderr.txt")) as f:
        return f.read().strip()


def run(specs, record_path, work_dir, workers=2, budget=0.0, data_dir="",
        log=print, env=None):
    """Runs the specs not yet in the record (nor failed there), `workers`
    processes at a time, in order. `specs` is a list, or a function of the
    record's runs returning one (a plan's `all_specs`): asked again after
    each finished run, so that runs waiting on others (a sweep's best rate)
    start as soon as they can. With `budget` (seconds) no run starts after
    it has passed (nor a task expected to end after it), and runs still
    going at its end are stopped (a training run's epoch checkpoints let a
    rerun resume it). A failed run is logged with its stderr's last line
    and not started again by this call; a failed task is also recorded.
    The processes start from `env` (default this one's environment).
    Returns the runs finished by this call; raises `NoGPU` where a task
    exited `NO_GPU`."""
    plan = specs if callable(specs) else (lambda runs: specs)
    deadline = time.monotonic() + budget if budget else float("inf")
    busy, finished, tried, said = {}, [], set(), set()
    longest = {}  # A task's (part, backend): the longest one in this call.

    def todo(runs):
        done = {run_key(r) for r in runs + failures(record_path)} | tried
        left = [s for s in plan(runs) if run_key(s) not in done]
        absent = collections.Counter(
            s["run_backend"] for s in left
            if "run_backend" in s and not installed(s["run_backend"]))
        for backend in set(absent) - said:
            said.add(backend)
            log(f"{backend} is not installed here: its {absent[backend]} "
                "run(s) wait for a call where it is")
        return [s for s in left if s.get("run_backend") not in absent]

    waiting, closed = todo(load(record_path)), False
    while waiting or busy:
        while waiting and len(busy) < workers and not closed:
            spec, clock = waiting[0], time.monotonic()
            cost = (longest.get((spec.get("part"), spec.get("run_backend")), 0)
                    if "module" in spec else 0)
            if clock + cost > deadline:
                closed = clock < deadline
                if closed:
                    log(f"not started {run_key(spec)}: it would end after the "
                        f"budget ({cost:.0f} s, {deadline - clock:.0f} s left)")
                break
            waiting.pop(0)
            tried.add(run_key(spec))
            busy[_start(spec, work_dir, data_dir, env)] = (spec, clock)
            log(f"start {run_key(spec)}")
        if closed or time.monotonic() >= deadline:
            waiting, closed = [], True
        time.sleep(POLL)
        for proc in list(busy):
            spec, started = busy[proc]
            took, limit = time.monotonic() - started, spec.get("limit_seconds")
            over = limit is not None and took >= limit
            past = time.monotonic() >= deadline
            if proc.poll() is None and not over and not past:
                continue
            busy.pop(proc)
            key, directory = run_key(spec), model_dir(spec, work_dir)
            task, code, record = "module" in spec, proc.poll(), None
            if code is None:
                _stop(proc, task)
                if past:
                    log(f"stopped {key} at the end of the budget")
                    continue
                error = (_stderr(directory)
                         + f"\ndid not finish within {limit:g} s").strip()
            elif task and code == NO_GPU:
                for other in busy:
                    _stop(other, "module" in busy[other][0])
                said = (_stderr(directory).splitlines() or ["exit 3"])[-1]
                raise NoGPU(f"{key}: {said}; it needs a GPU")
            else:
                record = None if code else collect(spec, directory, took)
                error = _stderr(directory) or f"exit {code}"
                if not code:
                    error += "\nno RESULT line"
            if record is None:
                line = (error.splitlines() or ["?"])[-1]
                log(f"{'failed' if task else 'stopped'} {key} ("
                    + ("time limit" if code is None else f"exit {code}")
                    + f"): {line}")
                if task:
                    save(record_path, load(record_path),
                         failed=failures(record_path) + [dict(
                             spec, error=error[-2000:], **stamp(spec),
                             wall_seconds=round(took, 1))])
                continue
            if task:
                cost = (spec.get("part"), spec.get("run_backend"))
                longest[cost] = max(longest.get(cost, 0), took)
            record.update(stamp(spec))
            runs = load(record_path) + [record]
            save(record_path, runs, updated=datetime.date.today().isoformat())
            finished.append(record)
            log(f"done {key}" + (f": val {record['val_accuracy']:.4f}"
                                 if "val_accuracy" in record else
                                 f" ({took:.0f} s)" if task else ""))
            if not closed:
                waiting = todo(runs)
    return finished
