"""The runner of the GPU check: each task (a JSON dict) runs in a process
of its own, `python -m bench.gpu_campaign --child TASK`, on its backend
(Keras fixes it at import), by `TASKS[part](task)`; a `Campaign` keeps the record
(`<out>.json`, resumed from, and `<out>.md`) and the budget, and runs a
part's tasks one after another (`run_items`).
"""

import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

import bench
from bench.study.runner import now
from bench.study.runner import nvidia_smi
from bench.study.runner import version

VERSIONS = ["keras", "jax", "jaxlib", "torch", "numpy", "grain"]
NO_GPU = 3  # A child's exit code: no GPU where the campaign needs one.
# Part a's optimizers: the name a result records, and the optimizer's in
# `bench/micro/optimizer_step.py`'s `optimizers()`, which makes it.
OPTIMIZERS = {
    "lso_sgd": ("LossScaleOptimizer(SGD(0.1, momentum=0.9))", "LSO(SGD)"),
    "lars_mixed": ("LARSMixed(0.1, momentum=0.9, weight_decay=5e-5)",
                   "LARSMixed"),
    "lamb_mixed": ("LAMBMixed(1e-3, weight_decay=1e-2)", "LAMBMixed"),
}


def child(task):
    """Runs one task (JSON) in this process and prints `RESULT <json>`
    with the backend and device; exits `NO_GPU` instead where the device is
    a CPU and the task is not the smoke's."""
    # The micro-benchmarks import Keras: in the tasks' processes only.
    import keras

    from bench.micro import applications

    task = json.loads(task)
    backend = keras.backend.backend()
    device = applications.device_name(backend)
    if not task["smoke"] and device.startswith("cpu"):
        print(f"{backend} sees no GPU ({device})", file=sys.stderr)
        return NO_GPU
    result = TASKS[task["part"]](task)
    print("RESULT " + json.dumps(dict(result, backend=backend, device=device)),
          flush=True)
    return 0


def brief(r):
    """One result in a few words, for the progress lines."""
    if "images_per_s" in r:
        return f"{r['images_per_s']:.1f} images/s on {r['device']}"
    return ", ".join(f"{k} {v:.2f} ms" for k, v in r.items()
                     if isinstance(v, float) and not k.endswith("_cpu"))


class Deadline(Exception):
    """The budget ran out; finished items are saved."""


class Campaign:
    """The JSON record and the budget of one invocation."""

    def __init__(self, args, markdown, environ=None):
        self.args, self.path = args, args.out + ".json"
        self.markdown = markdown  # record -> the text of <out>.md
        # The environment the tasks' processes start from (default ours).
        self.environ = dict(os.environ if environ is None else environ)
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
            started=now(), command="python -m bench.gpu_campaign "
            + " ".join(sys.argv[1:]), parts=args.parts,
            host=f"{platform.machine()}, {os.cpu_count()} CPUs",
            gpu=nvidia_smi("name,memory.total,driver_version").replace(
                "\n", "; ") or None, python=platform.python_version(),
            versions={p: version(p) for p in VERSIONS}, finished=[])
        self.record.setdefault("sessions", []).append(self.session)
        self.log_path = args.out + ".log"

    def save(self):
        from keras_largebatch._shared import atomic_write

        started = datetime.datetime.fromisoformat(self.session["started"])
        self.session["seconds"] = round(time.time() - started.timestamp(), 1)
        atomic_write(self.path, json.dumps(self.record, indent=1))
        atomic_write(self.args.out + ".md", self.markdown(self.record))

    def left(self):
        return self.deadline - time.time()

    def installed(self, part, backend, count):
        """Whether `backend`'s package is here; if not, says so once and
        notes the `count` items of `part` left unmeasured."""
        if importlib.util.find_spec(backend) is not None:
            return True
        missing = self.session.setdefault("not_installed", {})
        if part not in missing.setdefault(backend, []):
            missing[backend].append(part)
            print(f"part {part}: {backend} is not installed here; its "
                  f"{count} item(s) are not measured", flush=True)
        return False

    def run_items(self, part, items, settings, item_seconds=None):
        """Runs the `items` (task dicts with a `key` and a `backend`) not yet
        in the record, each in a process of its own; one that fails or runs
        past `item_seconds` is kept under `failed` and the rest go on. True
        when every item of an installed backend is done or failed."""
        store = self.record.setdefault(part, {})
        if store.get("settings", settings) != settings:
            sys.exit(f"{self.path}: part {part} was measured with "
                     f"{store['settings']}, not {settings}; use another --out")
        store["settings"] = settings
        done = store.setdefault("results", {})
        failed = store.setdefault("failed", {})
        todo = [i for i in items if i["key"] not in done
                and i["key"] not in failed]
        absent = {b for b in {i["backend"] for i in todo} if not self.installed(
            part, b, sum(i["backend"] == b for i in todo))}
        todo = [i for i in todo if i["backend"] not in absent]
        seconds = {}
        for item in todo:
            # An item that would not end in time is not started.
            if self.left() < seconds.get(item["backend"], 0):
                raise Deadline
            start = time.time()
            value, error = self.run_task(
                dict(item, part=part, settings=settings, smoke=self.args.smoke),
                min(self.left(), item_seconds or float("inf")))
            took = time.time() - start
            if value is not None:
                seconds[item["backend"]] = max(seconds.get(item["backend"], 0),
                                               took)
                done[item["key"]] = dict(value, seconds=round(took, 1),
                                         finished=now())
                print(f"{part} {item['key']}: {brief(value)}", flush=True)
            else:
                if self.left() <= 0:
                    raise Deadline
                failed[item["key"]] = dict(error=error[-2000:], finished=now())
                print(f"{part} {item['key']}: FAILED; "
                      f"{error.strip().splitlines()[-1:]}", flush=True)
            self.save()
        return all(i["key"] in done or i["key"] in failed for i in todo)

    def run_task(self, task, seconds):
        """(result, None), or (None, the error) where the task's process
        failed or ran past `seconds`; its output is added to `<out>.log`.
        A process that finds no GPU ends the campaign: only the smoke may
        run on a CPU, where a campaign would spend its budget measuring
        nothing."""
        env = bench.environ(dict(
            self.environ, KERAS_BACKEND=task["backend"],
            TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1"))
        try:
            proc = subprocess.run(
                bench.command("bench.gpu_campaign", "--child", json.dumps(task)),
                env=env,
                capture_output=True, text=True,
                timeout=None if seconds == float("inf") else max(seconds, 1))
            out, err, code = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out, err = (x.decode() if isinstance(x, bytes) else x or ""
                        for x in (e.stdout, e.stderr))
            err, code = err + f"\ndid not finish within {seconds:g} s", "timeout"
        with open(self.log_path, "a") as log:
            log.write(f"--- {task['part']} {task['key']} ({now()})\n{err}{out}")
        if code == NO_GPU:
            sys.exit(f"{task['backend']}: {err.strip()}; the campaign needs a "
                     "GPU (or --smoke)")
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        if code or not lines:
            return None, err.strip() or f"exit {code}, no result"
        return json.loads(lines[-1][len("RESULT "):]), None


# ------------------------------------------------- in the tasks' processes


def task_a(task):
    import keras

    from bench.micro import applications as apps
    from bench.micro import optimizer_step

    s = task["settings"]
    keras.backend.clear_session()
    keras.config.set_dtype_policy(s["precision"])
    model = apps.build_model(task["model"], s["size"])
    label, name = OPTIMIZERS[task["optimizer"]]
    optimizer = optimizer_step.optimizers()[name]()
    result = apps.fit_images_per_s(
        model, optimizer, s["batch"], s["size"], s["steps"], s["warmup"],
        jit_compile=True if task.get("compiled") else "auto")
    keras.config.set_dtype_policy("float32")
    return dict(result, model=apps.LABELS[task["model"]], optimizer=label)


def task_b(task):
    from bench.micro import optimizer_step

    _, ms = optimizer_step.measure_backend(
        task["settings"]["steps"], task["settings"]["optimizers"])
    return ms


TASKS = {"a": task_a, "b": task_b, "compiled": task_a}
