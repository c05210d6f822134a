"""Everything GPU-bound, in one resumable command (issue #23).

Parts, in order of value, each a list of items that are measured once:

a. ResNet-50 training images/s at 224x224, batch 256, `mixed_float16`, one
   synthetic batch on the device, the step `fit` compiles, median of 20
   steps after 5 warm-up steps (`bench/applications.py`'s
   `fit_images_per_s`): on `keras.applications.ResNet50`, Keras'
   `LossScaleOptimizer(SGD)` against `LARSMixed` and `LAMBMixed`; under
   `LossScaleOptimizer(SGD)`, `keras.applications.ResNet50` against ours (v1,
   v1.5, each with and without conv biases); JAX and torch.
b. The optimizer-step times and ratios of `bench/optimizer_step.py`
   (its `measure_backend`), JAX and torch.
c. The large-batch study of `bench/large_batch_study.py` (its `plan`,
   `train_argv`, `collect`, `claims` and `report`) with ResNet-20 (width 16)
   on Fashion-MNIST, JAX: B = 128 and 32 x B; SGD, LARSMixed, LAMBMixed;
   8-epoch sweeps, second seeds, 32-epoch runs, then 96-epoch runs, then
   64 x B. Batches above 256 accumulate gradients over micro-batches of
   256, as in the CPU study (batch norm per 256 images). Each run is
   `keras_largebatch.train.main.main(argv)` inside one of `--study_workers`
   long-lived processes sharing the GPU.

Each backend runs in its own process (Keras fixes it at import). Finished
items are kept in `<out>.json` and skipped by a rerun, so each call can be
one 10-minute device command: `--budget_seconds` stops starting work that
would not end in time and stops what runs at the deadline (losing only the
item in progress). `<out>.md` holds the tables, the device, the versions,
the dates and the commands.

    python bench/gpu_campaign.py --prepare .gpu_campaign   # here, once
    python bench/gpu_campaign.py --data_dir .gpu_campaign/fashion-mnist
    python bench/gpu_campaign.py --smoke --out /tmp/smoke  # a CPU, minutes

`--prepare DIR` puts the wheels the GPU image lacks and Fashion-MNIST into
DIR and prints the device commands. `--smoke` runs every part with tiny
sizes, through the same code.
"""

import argparse
import datetime
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "gpu_campaign")
PREPARED_LIMIT_MIB = 50

# Not in the GPU image (its python3 has jax, torch, numpy, ml-dtypes,
# absl-py, rich, h5py, packaging, protobuf, etils, cloudpickle, psutil,
# scikit-learn, matplotlib, pillow): Keras, Grain and what they need.
WHEELS = ["keras", "namex", "optree", "grain", "array-record", "portpicker",
          "tensorboardX"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
VERSIONS = ["keras", "jax", "jaxlib", "torch", "numpy", "grain"]

OPTIMIZERS = {
    "lso_sgd": "LossScaleOptimizer(SGD(0.1, momentum=0.9))",
    "lars_mixed": "LARSMixed(0.1, momentum=0.9, weight_decay=5e-5)",
    "lamb_mixed": "LAMBMixed(1e-3, weight_decay=1e-2)",
}
# Part a, (backend, model, optimizer), in order of value: the optimizer
# ratios on both backends, our models on JAX, then the rest.
A_ITEMS = [
    ("jax", "keras", "lso_sgd"), ("jax", "keras", "lars_mixed"),
    ("torch", "keras", "lso_sgd"), ("torch", "keras", "lars_mixed"),
    ("jax", "v1", "lso_sgd"), ("jax", "v1.5", "lso_sgd"),
    ("jax", "v1-nobias", "lso_sgd"), ("jax", "v1.5-nobias", "lso_sgd"),
    ("jax", "keras", "lamb_mixed"), ("torch", "keras", "lamb_mixed"),
    ("torch", "v1", "lso_sgd"), ("torch", "v1.5", "lso_sgd"),
    ("torch", "v1-nobias", "lso_sgd"), ("torch", "v1.5-nobias", "lso_sgd"),
]
A_SETTINGS = dict(size=224, batch=256, steps=20, warmup=5,
                  precision="mixed_float16")
B_SETTINGS = dict(steps=20, optimizers=None)
# Part c: one study, grown pass by pass (each pass is the study's plan with
# these settings; runs are keyed by their epochs, so passes share runs).
C_SETTINGS = dict(depth=20, width=16, small_batch=128, replica_batch=256,
                  optimizers=["sgd", "lars_mixed", "lamb_mixed"],
                  short_epochs=8, rates=4, steps_per_epoch=0,
                  passes=[dict(factors=[32], long_epochs=32),
                          dict(factors=[32], long_epochs=96),
                          dict(factors=[32, 64], long_epochs=32)])

SMOKE_A = [("jax", "keras", "lso_sgd"), ("torch", "keras", "lso_sgd"),
           ("torch", "keras", "lars_mixed"), ("torch", "v1", "lamb_mixed")]
SMOKE = dict(
    a=dict(size=32, batch=2, steps=2, warmup=1, precision="mixed_float16"),
    b=dict(steps=2, optimizers=["LSO(SGD)", "LARSMixed"]),
    c=dict(depth=8, width=4, small_batch=8, replica_batch=16,
           optimizers=["sgd", "lars_mixed", "lamb_mixed"], short_epochs=1,
           rates=1, steps_per_epoch=2,
           passes=[dict(factors=[4], long_epochs=2, batches=[32],
                         phases=["short", "long"])]),
)


def bench_module(name):
    """`bench/<name>.py`, imported by its path (the repository's top-level
    `applications/` package must not shadow `bench/applications.py`)."""
    key = "bench_" + name
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            key, os.path.join(HERE, name + ".py"))
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


# ---------------------------------------------------------------- children


def make_optimizer(name):
    import keras

    import keras_largebatch as klb

    if name == "lso_sgd":
        return keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1, momentum=0.9))
    if name == "lars_mixed":
        return klb.LARSMixed(0.1, momentum=0.9, weight_decay=5e-5)
    return klb.LAMBMixed(1e-3, weight_decay=1e-2)


def task_a(task):
    import keras

    apps = bench_module("applications")
    s = task["settings"]
    keras.backend.clear_session()
    keras.config.set_dtype_policy(s["precision"])
    model = apps.build_model(task["model"], s["size"])
    result = apps.fit_images_per_s(
        model, make_optimizer(task["optimizer"]), s["batch"], s["size"],
        s["steps"], s["warmup"])
    keras.config.set_dtype_policy("float32")
    return dict(result, model=apps.LABELS[task["model"]],
                optimizer=OPTIMIZERS[task["optimizer"]])


def task_b(task):
    _, ms = bench_module("optimizer_step").measure_backend(
        task["settings"]["steps"], task["settings"]["optimizers"])
    return ms


def task_c(task):
    import gc

    import keras

    from keras_largebatch.train import main as train_main

    study = bench_module("large_batch_study")
    args = argparse.Namespace(**task["args"])
    keras.backend.clear_session()
    gc.collect()
    start = time.perf_counter()
    code = train_main.main(
        ["keras-largebatch-train", *study.train_argv(task["spec"], args)])
    if code:
        raise RuntimeError(f"keras-largebatch-train exited {code}")
    return study.collect(task["spec"], args, time.perf_counter() - start)


def child():
    """A worker: one JSON task a line on stdin, one `RESULT`/`FAILED` line
    each on stdout."""
    import keras

    apps = bench_module("applications")
    backend = keras.backend.backend()
    facts = {"backend": backend, "device": apps.device_name(backend)}
    print("READY " + json.dumps(facts), flush=True)
    for line in sys.stdin:
        task = json.loads(line)
        try:
            result = {"a": task_a, "b": task_b, "c": task_c}[task["part"]](task)
        except Exception:  # noqa: BLE001 - reported to the parent
            print("FAILED " + json.dumps(traceback.format_exc()), flush=True)
            continue
        print("RESULT " + json.dumps(dict(result, **facts)), flush=True)


class Worker:
    """A child process of one backend; its result lines go to `results`."""

    environ = None  # The environment workers start from (default: ours).

    def __init__(self, backend, results, log_path, env=()):
        env = dict(self.environ or os.environ, KERAS_BACKEND=backend,
                   TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", **dict(env))
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True, cwd=os.getcwd())
        self.backend, self.task = backend, None
        self.reader = threading.Thread(target=self._read, args=(results,),
                                       daemon=True)
        self.reader.start()

    def _read(self, results):
        for line in self.proc.stdout:
            self.log.write(line)
            for tag in ("READY", "RESULT", "FAILED"):
                if line.startswith(tag + " "):
                    results.put((self, tag, json.loads(line[len(tag) + 1:])))
        results.put((self, "EXIT", self.proc.wait()))

    def send(self, task):
        self.task = task
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)  # It writes to the log until EOF.
        self.log.close()


class Deadline(Exception):
    """The budget ran out; finished items are saved."""


class Campaign:
    """The JSON record, the budget and the workers of one invocation."""

    def __init__(self, args):
        self.args, self.path = args, args.out + ".json"
        self.deadline = (time.time() + args.budget_seconds
                         if args.budget_seconds else float("inf"))
        self.record = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.record = json.load(f)
        if self.record.get("smoke", args.smoke) != args.smoke:
            sys.exit(f"{self.path} holds a {'smoke' if args.smoke else 'real'}"
                     " campaign's opposite; use another --out")
        self.record["smoke"] = args.smoke
        self.session = dict(
            started=_now(), command="python bench/gpu_campaign.py "
            + " ".join(sys.argv[1:]), parts=args.parts,
            host=f"{platform.machine()}, {os.cpu_count()} CPUs",
            gpu=_nvidia_smi(), python=platform.python_version(),
            versions={p: _version(p) for p in VERSIONS}, finished=[])
        self.record.setdefault("sessions", []).append(self.session)
        self.results = queue.Queue()
        self.log_path = args.out + ".log"

    def save(self):
        from keras_largebatch._shared import atomic_write

        self.session["seconds"] = round(
            time.time() - _parse(self.session["started"]), 1)
        atomic_write(self.path, json.dumps(self.record, indent=1))
        atomic_write(self.args.out + ".md",
                     markdown(self.record, self.args.out + "_study.md"))

    def left(self):
        return self.deadline - time.time()

    def wait(self):
        """The next line of any worker, or `Deadline`."""
        try:
            left = self.left()
            return self.results.get(
                timeout=None if left == float("inf") else max(left, 0))
        except queue.Empty:
            raise Deadline from None

    def start(self, backend, env=()):
        """A new worker, once it is ready (other workers' lines are kept)."""
        worker = Worker(backend, self.results, self.log_path, env)
        others = []
        try:
            while True:
                got, tag, value = self.wait()
                if got is not worker:
                    others.append((got, tag, value))
                elif tag == "READY":
                    # A campaign on a CPU would spend its budget measuring
                    # nothing: only the smoke may run there.
                    if not self.args.smoke and value["device"].startswith("cpu"):
                        worker.stop()
                        sys.exit(f"{backend} sees no GPU ({value['device']}); "
                                 "the campaign needs one (or --smoke)")
                    return worker
                else:
                    sys.exit(f"a {backend} worker ended ({tag}) before "
                             f"starting; see {self.log_path}")
        finally:
            for line in others:
                self.results.put(line)

    def run_items(self, part, items, settings):
        """Runs the `items` (task dicts with a `key` and a `backend`) not yet
        in the record, one worker per run of same-backend items."""
        store = self.record.setdefault(part, {})
        if store.get("settings", settings) != settings:
            sys.exit(f"{self.path}: part {part} was measured with "
                     f"{store['settings']}, not {settings}; use another --out")
        store["settings"] = settings
        done = store.setdefault("results", {})
        todo = [i for i in items if i["key"] not in done]
        worker, seconds = None, {}
        try:
            for item in todo:
                # An item that would not end in time is not started.
                if self.left() < seconds.get(item["backend"], 0):
                    raise Deadline
                if worker and worker.backend != item["backend"]:
                    worker.stop()
                    worker = None
                worker = worker or self.start(item["backend"])
                start = time.time()
                worker.send(dict(item, part=part, settings=settings))
                while True:
                    got, tag, value = self.wait()
                    if got is not worker:
                        continue
                    if tag == "RESULT":
                        seconds[item["backend"]] = max(
                            seconds.get(item["backend"], 0), time.time() - start)
                        done[item["key"]] = dict(
                            value, seconds=round(time.time() - start, 1),
                            finished=_now())
                        self.save()
                        print(f"{part} {item['key']}: {_brief(value)}",
                              flush=True)
                        break
                    worker.stop()
                    raise SystemExit(f"part {part} {item['key']} failed "
                                     f"({tag}): {value}; see {self.log_path}")
        finally:
            if worker:
                worker.stop()
        return not todo or all(i["key"] in done for i in items)

    def run_study(self, settings):
        """Part c: the study's plan, pass by pass, over several workers."""
        study = bench_module("large_batch_study")
        record = self.record.setdefault("c", {"runs": []})
        first = study_args(settings, settings["passes"][0], self.args)
        record.update(
            settings=settings,
            args=dict(vars(first), factors=sorted({
                f for p in settings["passes"] for f in p["factors"]})),
            command=self.session["command"],
            machine=f"{self.session['gpu'] or 'no GPU'}, {self.session['host']}")
        record.setdefault("started", _now())
        runs = record["runs"]
        workers, busy = [], {}
        count = self.args.study_workers
        env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / count:.2f}"}

        def base_sweep(spec, pass_args):
            default, _ = study.recipe_default(spec["optimizer"], spec["batch"],
                                              pass_args.short_epochs)
            return spec["phase"] == "short" and any(
                abs(spec["rate"] / r - 1) < 1e-9 for r in study.sweep_rates(
                    default, pass_args.rates, pass_args.rate_step))

        def next_spec():
            done = {study.run_key(r) for r in runs}
            taken = {study.run_key(t["spec"]) for t in busy.values()}
            groups = {(t["spec"]["optimizer"], t["spec"]["batch"])
                      for t in busy.values()}
            for p in settings["passes"]:
                pass_args = study_args(settings, p, self.args)
                for spec in study.plan(pass_args, runs):
                    key = study.run_key(spec)
                    if (key in done or key in taken
                            or spec["phase"] not in p.get("phases", [spec["phase"]])
                            or p.get("batches") and spec["batch"] not in p["batches"]):
                        continue
                    # A follow-up waits for the runs of its (optimizer, batch)
                    # in flight (it needs their best rate); a run that would
                    # not end in time is left for the next call.
                    if ((spec["optimizer"], spec["batch"]) in groups
                            and not base_sweep(spec, pass_args)
                            or self.left() < estimate(spec, runs)):
                        continue
                    return dict(spec=spec, args=vars(pass_args))
            return None

        try:
            while True:
                idle = [w for w in workers if w not in busy]
                while len(workers) < count and not idle:
                    task = next_spec()
                    if task is None:
                        break
                    workers.append(self.start("jax", env))
                    idle = [workers[-1]]
                for worker in idle:
                    task = next_spec()
                    if task is None:
                        break
                    worker.send(dict(task, part="c"))
                    busy[worker] = task
                if not busy:
                    break
                got, tag, value = self.wait()
                if got not in workers:
                    continue
                if tag == "RESULT":
                    busy.pop(got)
                    runs.append(dict(value, finished=_now()))
                    record["claims"] = study.claims(record)
                    self.save()
                    print(f"c {study.run_key(value)}: val "
                          f"{value['val_accuracy']:.4f} "
                          f"({value['wall_seconds']:.0f} s)", flush=True)
                elif tag in ("FAILED", "EXIT"):
                    raise SystemExit(f"part c {got.task} failed ({tag}): "
                                     f"{value}; see {self.log_path}")
        finally:
            for worker in workers:
                worker.stop()
        # Complete when nothing is left to run, not just nothing that fits.
        self.deadline, deadline = float("inf"), self.deadline
        complete = next_spec() is None
        self.deadline = deadline
        record["complete"] = complete
        return complete


def estimate(spec, runs):
    """Seconds a run should take: the line (start-up, then per epoch)
    through the mean wall times of the finished runs of its batch at their
    shortest and longest budgets; 0 before any."""
    walls = {}
    for r in runs:
        if r["batch"] == spec["batch"]:
            walls.setdefault(r["epochs"], []).append(r["wall_seconds"])
    if not walls:
        return 0.0
    mean = {epochs: sum(w) / len(w) for epochs, w in walls.items()}
    low, high = min(mean), max(mean)
    if low == high:
        return spec["epochs"] * mean[low] / low
    per_epoch = (mean[high] - mean[low]) / (high - low)
    return max(mean[low] + per_epoch * (spec["epochs"] - low), 0.0)


def study_args(settings, one_pass, args):
    study = bench_module("large_batch_study")
    flags = [
        "--model", "resnet_cifar", "--dataset", args.dataset,
        "--depth", str(settings["depth"]), "--width", str(settings["width"]),
        "--small_batch", str(settings["small_batch"]),
        "--replica_batch", str(settings["replica_batch"]),
        "--short_epochs", str(settings["short_epochs"]),
        "--rates", str(settings["rates"]),
        "--steps_per_epoch", str(settings["steps_per_epoch"]),
        "--long_epochs", str(one_pass["long_epochs"]),
        "--factors", *map(str, one_pass["factors"]),
        "--optimizers", *settings["optimizers"],
        "--work_dir", args.work_dir, "--data_dir", args.data_dir or "",
    ]
    if args.smoke:
        flags += ["--extend", "0"]
    return study.make_parser().parse_args(flags)


# ---------------------------------------------------------------- report


def markdown(record, study_path):
    """The tables of `record`; part c's study report is also written to
    `study_path`."""
    lines = ["# GPU campaign (`bench/gpu_campaign.py`)", ""]
    if record.get("smoke"):
        lines += ["**Smoke run**: tiny sizes on whatever machine ran it; the "
                  "numbers measure nothing.", ""]
    lines += ["| started (UTC) | seconds | GPU | host | Python | versions "
              "| parts done | command |", "|---|---|---|---|---|---|---|---|"]
    for s in record.get("sessions", []):
        versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items() if v)
        lines.append(
            f"| {s['started']} | {s.get('seconds', '')} | "
            f"{s['gpu'] or 'none'} | {s['host']} | {s['python']} | "
            f"{versions} | {', '.join(s['finished']) or '–'} | "
            f"`{s['command']}` |")
    a = record.get("a")
    if a:
        s = a["settings"]
        lines += [
            "", "## a. ResNet-50 training throughput", "",
            f"{s['size']}x{s['size']}, batch {s['batch']}, {s['precision']}, "
            f"one synthetic batch on the device, the step `fit` compiles, "
            f"median of {s['steps']} steps after {s['warmup']} warm-up steps.",
            "", "| backend | device | model | optimizer | images/s | median "
            "step ms | vs the backend's Keras ResNet50 + LSO(SGD) |",
            "|---|---|---|---|---|---|---|"]
        results = a["results"]
        for key, r in results.items():
            backend = key.split("|")[0]
            base = results.get(f"{backend}|keras|lso_sgd")
            ratio = f"{r['images_per_s'] / base['images_per_s']:.3f}" if base else "–"
            lines.append(
                f"| {backend} | {r['device']} | {r['model']} | "
                f"{r['optimizer']} | {r['images_per_s']:,.1f} | "
                f"{1000 * r['median_step_s']:.1f} | {ratio} |")
        lines += ["", "Targets:"]
        for backend, target in (("jax", 0.99), ("torch", 0.97)):
            lso = results.get(f"{backend}|keras|lso_sgd")
            lars = results.get(f"{backend}|keras|lars_mixed")
            if lso and lars:
                ratio = lars["images_per_s"] / lso["images_per_s"]
                lines.append(f"- LARSMixed / LSO(SGD) on {backend} >= {target}:"
                             f" {ratio:.3f}, **{_verdict(ratio >= target)}**")
            else:
                lines.append(f"- LARSMixed / LSO(SGD) on {backend} >= {target}:"
                             " not measured")
        ours = [r for k, r in results.items()
                if k.startswith("jax|v") and k.endswith("|lso_sgd")]
        if ours:
            top = max(ours, key=lambda r: r["images_per_s"])
            lines.append(f"- our ResNet-50 on jax >= 6,500 images/s: best "
                         f"{top['images_per_s']:,.1f} ({top['model']}), "
                         f"**{_verdict(top['images_per_s'] >= 6500)}**")
        else:
            lines.append("- our ResNet-50 on jax >= 6,500 images/s: not "
                         "measured")
    b = record.get("b")
    if b:
        pairs = [("LARS", "SGD"), ("LARSMixed", "LSO(SGD)"), ("LAMB", "Adam"),
                 ("LAMBMixed", "LSO(Adam)")]
        names = [n for pair in pairs for n in pair]
        lines += [
            "", "## b. Optimizer step (`bench/optimizer_step.py`)", "",
            f"ResNet-50's trainable variables, median of "
            f"{b['settings']['steps']} steps, wall-clock ms.", "",
            "| backend | device | " + " | ".join(names) + " | "
            + " | ".join(f"{x}/{y}" for x, y in pairs) + " |",
            "|---" * (2 + len(names) + len(pairs)) + "|"]
        floors = []
        for backend, r in b["results"].items():
            ms = [f"{r[n]:.2f}" if n in r else "–" for n in names]
            ratios = [f"{r[x] / r[y]:.2f}" if x in r and y in r else "–"
                      for x, y in pairs]
            lines.append(f"| {backend} | {r['device']} | " + " | ".join(ms)
                         + " | " + " | ".join(ratios) + " |")
            for rule, base in (("LARS", "SGD"), ("LAMB", "Adam")):
                if f"floor_{rule}" in r:
                    x, y = r[f"floor_{rule}"], r[f"floor_{base}"]
                    floors.append(f"- floor on {backend}, minimal jitted JAX "
                                  f"{rule}/{base}: {x:.2f} / {y:.2f} ms = "
                                  f"{x / y:.2f}")
        lines += [""] + floors if floors else []
    c = record.get("c")
    if c and c.get("runs"):
        study = bench_module("large_batch_study")
        s = c["settings"]
        lines += [
            "", "## c. Large-batch study", "",
            f"Passes: {s['passes']}; "
            f"{'complete' if c.get('complete') else 'not complete'}.", ""]
        text = study.report(c, study_path)
        lines += ["#" + line if line.startswith("#") else line
                  for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def _verdict(holds):
    return "met" if holds else "not met"


def _brief(r):
    if "images_per_s" in r:
        return f"{r['images_per_s']:.1f} images/s on {r['device']}"
    return ", ".join(f"{k} {v:.2f} ms" for k, v in r.items()
                     if isinstance(v, float) and not k.endswith("_cpu"))


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")


def _parse(stamp):
    return datetime.datetime.fromisoformat(stamp).timestamp()


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_smi():
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
         "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().replace("\n", "; ") or None


# ---------------------------------------------------------------- prepare


def prepare(folder):
    """Wheels and Fashion-MNIST for the GPU machine, in `folder`."""
    from keras_largebatch.train import data

    wheels = os.path.join(folder, "wheels")
    os.makedirs(wheels, exist_ok=True)
    pins = [f"{p}=={_version(p)}" if _version(p) else p for p in WHEELS]
    platforms = [x for tag in PLATFORMS for x in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-d", wheels, *pins],
                   check=True)
    source = data.find_fashion_mnist()
    if source is None:
        subprocess.run(["apt-get", "install", "-y", "dataset-fashion-mnist"],
                       check=True)
        source = data.find_fashion_mnist()
    if source is None:
        sys.exit("Fashion-MNIST not found (dataset-fashion-mnist installed?)")
    target = os.path.join(folder, "fashion-mnist")
    os.makedirs(target, exist_ok=True)
    for name in data.FASHION_MNIST_FILES:
        shutil.copy(os.path.join(source, name), target)
    size = sum(os.path.getsize(p) for p in glob.glob(
        os.path.join(folder, "**"), recursive=True) if os.path.isfile(p))
    mib = size / 2**20
    if mib > PREPARED_LIMIT_MIB:
        sys.exit(f"{folder} holds {mib:.1f} MiB, over {PREPARED_LIMIT_MIB}")
    rel = os.path.relpath(os.path.abspath(folder), ROOT)
    print(f"\n{folder}: {mib:.1f} MiB "
          f"({len(os.listdir(wheels))} wheels, Fashion-MNIST)\n")
    print("Device command (run it until it prints 'campaign complete'; "
          f"carry [\"{rel}\"]; each call resumes from "
          "bench/results/gpu_campaign.json: copy the call's gpu_campaign.json,"
          " .md and _study.md into bench/results/ before the next):\n")
    print(device_command(rel))


def device_command(folder):
    install = (
        "python3 -m pip install -q --no-index --no-deps --no-compile "
        "--no-cache-dir --upgrade --target /tmp/site "
        f"{folder}/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD "
        "PYTHONUNBUFFERED=1 || exit;")
    run = ("python3 bench/gpu_campaign.py --budget_seconds 540 "
           f"--data_dir {folder}/fashion-mnist 2>&1 | tee $OUT/campaign.log;")
    back = "cp bench/results/gpu_campaign* $OUT/"
    return f"{install} {run} {back}"


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="a,b,c",
                   help="comma-separated parts to run, in order: a, b, c")
    p.add_argument("--out", default=RESULTS,
                   help="writes OUT.json (resumed from), OUT.md, OUT.log")
    p.add_argument("--budget_seconds", type=float, default=0,
                   help="start nothing that would end later, stop at it "
                        "(0: no budget)")
    p.add_argument("--data_dir", default="",
                   help="Fashion-MNIST's folder (default: where the training "
                        "command looks)")
    p.add_argument("--study_workers", type=int, default=0,
                   help="processes sharing the GPU in part c (default 3; 2 "
                        "with --smoke)")
    p.add_argument("--work_dir", default="",
                   help="model folders of the study's runs (default: "
                        "runs/gpu_campaign; OUT_runs with --smoke)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes on this machine, through the same code")
    p.add_argument("--prepare", metavar="DIR",
                   help="put the wheels and data for the GPU machine in DIR "
                        "and print the device commands")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    for part in args.parts:
        if part not in ("a", "b", "c"):
            p.error(f"--parts: each part must be a, b or c. Received: {part}")
    if args.study_workers < 0:
        p.error(f"--study_workers must be >= 0. Received: {args.study_workers}")
    args.study_workers = args.study_workers or (2 if args.smoke else 3)
    args.work_dir = args.work_dir or (
        args.out + "_runs" if args.smoke else os.path.join("runs", "gpu_campaign"))
    # The smoke's study trains on the digits the command embeds (1,797
    # images): no data files needed, seconds per run.
    args.dataset = "digits" if args.smoke else "fashion_mnist"
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child()
    # This process imports Keras for helpers only: on JAX's CPU platform, so
    # that it never takes GPU memory from its workers, which start from the
    # environment as it was.
    Worker.environ = dict(os.environ)
    os.environ.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    if args.prepare:
        return prepare(args.prepare)
    if args.smoke and args.out == RESULTS:
        sys.exit("--smoke needs its own --out")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    campaign = Campaign(args)
    settings = SMOKE if args.smoke else dict(
        a=A_SETTINGS, b=B_SETTINGS, c=C_SETTINGS)
    a_items = SMOKE_A if args.smoke else A_ITEMS
    steps = {
        "a": lambda: campaign.run_items("a", [
            dict(key="|".join(i), backend=i[0], model=i[1], optimizer=i[2])
            for i in a_items], settings["a"]),
        "b": lambda: campaign.run_items("b", [
            dict(key=b, backend=b) for b in ("jax", "torch")], settings["b"]),
        "c": lambda: campaign.run_study(settings["c"]),
    }
    complete = True
    try:
        for part in args.parts:
            if not steps[part]():
                complete = False
                break
            campaign.session["finished"].append(part)
            campaign.save()
    except Deadline:
        complete = False
    campaign.save()
    print(markdown(campaign.record, args.out + "_study.md"))
    print("campaign complete" if complete else
          f"budget spent: run again to resume from {campaign.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
