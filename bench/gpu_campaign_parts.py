"""The parts of `bench/gpu_campaign.py` run by worker processes: what each
measures and how.

Each part is a list of tasks (JSON dicts) that a worker process runs with
`TASKS[part](task)`:

a. `task_a`: ResNet-50 training images/s (`bench/applications.py`'s
   `build_model` and `fit_images_per_s`), one (backend, model, optimizer)
   item a task; the `compiled` part is the same with `jit_compile=True`;
b. `task_b`: the optimizer-step times of `bench/optimizer_step.py`'s
   `measure_backend`, one backend a task;
c. `task_c`: one run of the scaling study (`bench/batch_scaling_study.py`),
   `keras_largebatch.train.main.main(argv)` in the worker. `StudyPlan`
   hands out the runs in the study's order of value and records what comes
   back.
"""

import importlib.util
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

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
B_BACKENDS = ("jax", "torch")
# The torch step Keras compiles (`jit_compile=True`, torch.compile).
COMPILED_ITEMS = [("torch", "keras", "lso_sgd"), ("torch", "keras", "lars_mixed")]
# Part c: `bench/batch_scaling_study.py`'s plan, its runs side by side on
# the one GPU (`--study_workers`).
C_SETTINGS = dict(study="batch_scaling_study")

SMOKE_A = [("jax", "keras", "lso_sgd"), ("torch", "keras", "lso_sgd"),
           ("torch", "keras", "lars_mixed"), ("torch", "v1", "lamb_mixed")]
# torch.compile of a ResNet-50 takes minutes on a CPU: the smoke compiles
# the package's ResNet-8 through the same code.
SMOKE_COMPILED = [("torch", "cifar8", "lars_mixed")]
# The smoke's study trains on Fashion-MNIST, as the GPU runs do (the same
# loader and files; a few steps an epoch, tiny batches).
SMOKE = dict(
    a=dict(size=32, batch=2, steps=2, warmup=1, precision="mixed_float16"),
    b=dict(steps=2, optimizers=["LSO(SGD)", "LARSMixed"]),
    c=dict(study="batch_scaling_study", sizes=dict(
        EPOCHS=2, SECOND_EPOCHS=1, SMALL_BATCH=8, MICRO_BATCH=16,
        BATCHES=[32], MAX_BATCH=32, SEEDS=[0], GROWN_SEEDS=[0],
        TUNED_SEEDS=[0],
        STEPS_PER_EPOCH=4, EVALS_PER_EPOCH=2, GROWN=[["default", {}]],
        NORMALISED=None, SECOND_BATCHES=[])),
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


def a_items(items, compiled=False):
    """Part a's tasks; `compiled`: the step Keras compiles with
    `jit_compile=True` (keys end in `|compiled`)."""
    return [dict(key="|".join(i) + ("|compiled" if compiled else ""),
                 backend=i[0], model=i[1], optimizer=i[2], compiled=compiled)
            for i in items]


def b_items():
    return [dict(key=b, backend=b) for b in B_BACKENDS]


# ---------------------------------------------------------------- in workers


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
        s["steps"], s["warmup"],
        jit_compile=True if task.get("compiled") else "auto")
    keras.config.set_dtype_policy("float32")
    return dict(result, model=apps.LABELS[task["model"]],
                optimizer=OPTIMIZERS[task["optimizer"]])


def task_b(task):
    _, ms = bench_module("optimizer_step").measure_backend(
        task["settings"]["steps"], task["settings"]["optimizers"])
    return ms


def task_c(task):
    """One run of the scaling study: the command in this worker."""
    import gc

    import keras

    from keras_largebatch.train import main as train_main

    study = bench_module(task["settings"]["study"])
    study.configure(**task["settings"].get("sizes", {}))
    keras.backend.clear_session()
    gc.collect()
    start = time.perf_counter()
    argv = study.train_argv(task["spec"], task["work_dir"], task["data_dir"])
    code = train_main.main(["keras-largebatch-train", *argv])
    if code:
        raise RuntimeError(f"keras-largebatch-train exited {code}")
    return study.collect(task["spec"], task["work_dir"],
                         time.perf_counter() - start)


TASKS = {"a": task_a, "b": task_b, "compiled": task_a, "c": task_c}


# ---------------------------------------------------------------- part c


class StudyPlan:
    """Part c: the scaling study's plan (`bench/batch_scaling_study.py`'s
    `plan`) handed out to workers; finished runs go to `record["runs"]`.
    Runs already in the study's own record (`known`, from any machine; not
    with --smoke or `settings["skip_known"]` false) are not run again."""

    part, backend = "c", "jax"

    def __init__(self, settings, args, record, session, now):
        self.study = bench_module(settings["study"])
        self.study.configure(**settings.get("sizes", {}))
        self.settings, self.args, self.record = settings, args, record
        record.setdefault("runs", [])
        record.update(settings=settings, command=session["command"],
                      machine=f"{session['gpu'] or 'no GPU'}, "
                              f"{session['host']}", backend="jax")
        record.setdefault("started", now)
        skip = settings.get("skip_known", True) and not args.smoke
        self.known = (self.study.load(self.study.OUT)["runs"] if skip
                      else [])

    def done(self):
        """The finished runs: this record's and the study's."""
        return self.record["runs"] + self.known

    def next_task(self, busy, left):
        """The next run to start (a task dict), given the tasks in flight
        and the seconds left; None when nothing is left that fits."""
        specs = [t["spec"] for t in busy]
        for spec in self.study.plan(self.done(), specs):
            # A run that would not end in time is left for the next call.
            if left < self.estimate(spec):
                continue
            return dict(spec=spec, settings=self.settings,
                        work_dir=self.args.work_dir,
                        data_dir=self.args.data_dir)
        return None

    def estimate(self, spec):
        """Seconds a run should take: the longest finished GPU run of its
        kind, batch and epochs (0 before any); runs from a CPU carry no
        `device`."""
        walls = [r["wall_seconds"] for r in self.done()
                 if "device" in r and (r["kind"], r["batch"], r["epochs"])
                 == (spec["kind"], spec["batch"], spec["epochs"])]
        return max(walls, default=0.0)

    def complete(self):
        """Nothing is left to run, not just nothing that fits."""
        return next(self.study.plan(self.done()), None) is None

    def finished(self, task, value, now):
        """Records a run's result; returns the line to print."""
        self.record["runs"].append(dict(value, finished=now))
        return (f"c {self.study.run_key(value)}: val "
                f"{value['val_accuracy']:.4f} "
                f"({value['wall_seconds']:.0f} s)")
