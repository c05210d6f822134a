"""The three parts of `bench/gpu_campaign.py`: what each measures and how.

Each part is a list of tasks (JSON dicts) that a worker process runs with
`TASKS[part](task)`:

a. `task_a`: ResNet-50 training images/s (`bench/applications.py`'s
   `build_model` and `fit_images_per_s`), one (backend, model, optimizer)
   item a task;
b. `task_b`: the optimizer-step times of `bench/optimizer_step.py`'s
   `measure_backend`, one backend a task;
c. `task_c`: one run of the large-batch study (`bench/large_batch_study.py`)
   or one grown-batch run, `keras_largebatch.train.main.main(argv)` in the
   worker. `StudyPlan` hands out the runs in the study's order of value,
   pass by pass, and records what comes back.
"""

import argparse
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
# Part c: one study, grown pass by pass (each pass is the study's plan with
# these settings; runs are keyed by their epochs, so passes share runs). A
# pass with `grown` runs the grown-batch runs instead (`grown_specs`).
C_SETTINGS = dict(depth=20, width=16, small_batch=128, replica_batch=256,
                  optimizers=["sgd", "lars_mixed", "lamb_mixed"],
                  short_epochs=8, rates=4, steps_per_epoch=0,
                  passes=[dict(factors=[32], long_epochs=32),
                          dict(grown=True, long_epochs=32),
                          dict(factors=[32], long_epochs=96),
                          dict(factors=[32, 64], long_epochs=32)],
                  # The grown batches (issue 30): from `small_batch`, split
                  # into `accumulation` micro-batches, up to `max_factor` x
                  # `small_batch`; the schedule doubles the batch at 1/8,
                  # 2/8, ... of the budget (Smith et al.).
                  grown=dict(policies=["noise_scale", "schedule"],
                             accumulation=2, max_factor=32))
# The command's flag for the schedule policy's (epoch, batch) steps. Its
# name is not final (issue 30 item 4): set it here, the one place it is used.
SCHEDULE_FLAG = "--batch_schedule"

SMOKE_A = [("jax", "keras", "lso_sgd"), ("torch", "keras", "lso_sgd"),
           ("torch", "keras", "lars_mixed"), ("torch", "v1", "lamb_mixed")]
# The smoke's study trains on Fashion-MNIST, as the GPU runs do (the same
# loader and files; two steps an epoch). It runs no grown batches.
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


def a_items(items):
    return [dict(key="|".join(i), backend=i[0], model=i[1], optimizer=i[2])
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
    spec = task["spec"]
    keras.backend.clear_session()
    gc.collect()
    start = time.perf_counter()
    argv = grown_argv(spec, args) if "policy" in spec else study.train_argv(
        spec, args)
    code = train_main.main(["keras-largebatch-train", *argv])
    if code:
        raise RuntimeError(f"keras-largebatch-train exited {code}")
    return study.collect(spec, args, time.perf_counter() - start)


TASKS = {"a": task_a, "b": task_b, "c": task_c}


# ---------------------------------------------------------------- part c


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
        "--factors", *map(str, one_pass.get("factors", [1])),
        "--optimizers", *settings["optimizers"],
        "--work_dir", args.work_dir, "--data_dir", args.data_dir or "",
    ]
    if args.smoke:
        flags += ["--extend", "0"]
    return study.make_parser().parse_args(flags)


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


def grown_phase(policy, phase):
    """The study's `phase` field of a grown run: its key and model folder
    (`run_key`, `model_dir_of`) then differ from every fixed run's."""
    return f"grown_{policy}_{phase}"


def grown_specs(settings, pass_args, runs):
    """The grown-batch runs of a pass, in order of value: each (policy,
    optimizer)'s sweep of the study's rates around the recipe's default at
    the starting batch (short budget), then, once a sweep is done, its best
    rate with a second seed and at the pass's long budget."""
    study = bench_module("large_batch_study")
    grown, start = settings["grown"], settings["small_batch"]
    top = start * grown["max_factor"]
    short = pass_args.short_epochs

    def spec(policy, phase, optimizer, epochs, rate, seed, default):
        _, warmup = study.recipe_default(optimizer, start, epochs)
        return dict(phase=grown_phase(policy, phase), policy=policy,
                    optimizer=optimizer, batch=start, max_batch=top,
                    accumulation=grown["accumulation"], epochs=epochs,
                    rate=rate, seed=seed, default_rate=default,
                    warmup_epochs=warmup,
                    schedule=schedule_steps(epochs, start, top)
                    if policy == "schedule" else None)

    for policy in grown["policies"]:
        for optimizer in pass_args.optimizers:
            default, _ = study.recipe_default(optimizer, start, short)
            for rate in study.sweep_rates(default, pass_args.rates,
                                          pass_args.rate_step):
                yield spec(policy, "short", optimizer, short, rate, 0, default)
    for policy in grown["policies"]:
        for optimizer in pass_args.optimizers:
            sweep = [r for r in runs if r["optimizer"] == optimizer
                     and r["phase"] == grown_phase(policy, "short")]
            if len(sweep) < pass_args.rates:
                continue
            best = max(sweep, key=lambda r: r["val_accuracy"])
            for phase, epochs, seed in (("seed", short, 1),
                                        ("long", pass_args.long_epochs, 0)):
                yield spec(policy, phase, optimizer, epochs, best["rate"],
                           seed, best["default_rate"])


def schedule_steps(epochs, start, top):
    """`EPOCH:BATCH,...`: the batch doubled at 1/8, 2/8, ... of `epochs`
    from `start` until it reaches `top`."""
    steps, batch, i = [], start, 0
    while batch < top:
        i, batch = i + 1, batch * 2
        steps.append(f"{max(i, round(epochs * i / 8))}:{batch}")
    return ",".join(steps)


def grown_argv(spec, args):
    """The command's arguments of a grown run: the study's, from the
    starting batch in `accumulation` micro-batches, with the policy."""
    study = bench_module("large_batch_study")
    argv = [a for a in study.train_argv(spec, args)
            if not a.startswith("--gradient_accumulation_steps=")]
    argv += [f"--gradient_accumulation_steps={spec['accumulation']}",
             f"--adaptive_batch={spec['policy']}",
             f"--max_global_batch_size={spec['max_batch']}"]
    if spec["policy"] == "schedule":
        argv.append(f"{SCHEDULE_FLAG}={spec['schedule']}")
    return argv


def grown_flags_exist():
    """Whether the command has `--adaptive_batch` (issue 30 item 4)."""
    from keras_largebatch.train import flags

    return "adaptive_batch" in flags.BY_NAME


class StudyPlan:
    """Part c's runs: the study's plan pass by pass (and the grown-batch
    runs), handed out to workers; finished runs go to `record` (`runs`,
    and `grown_runs` apart, which the study's report does not read)."""

    part, backend = "c", "jax"

    def __init__(self, settings, args, record, session, now):
        self.study = bench_module("large_batch_study")
        self.settings, self.args, self.record = settings, args, record
        fixed = [p for p in settings["passes"] if not p.get("grown")]
        first = study_args(settings, fixed[0], args)
        record.update(
            settings=settings,
            args=dict(vars(first), factors=sorted({
                f for p in fixed for f in p["factors"]})),
            command=session["command"],
            machine=f"{session['gpu'] or 'no GPU'}, {session['host']}")
        record.setdefault("started", now)
        self.grown = any(p.get("grown") for p in settings["passes"])
        self.grown_waiting = self.grown and not grown_flags_exist()
        if self.grown:
            record.setdefault("grown_runs", [])
        if self.grown_waiting:
            print("part c: keras-largebatch-train has no --adaptive_batch "
                  "yet; the grown-batch runs are left for a later call",
                  flush=True)

    def _base_sweep(self, spec, pass_args):
        default, _ = self.study.recipe_default(
            spec["optimizer"], spec["batch"], pass_args.short_epochs)
        return spec["phase"] == "short" and any(
            abs(spec["rate"] / r - 1) < 1e-9 for r in self.study.sweep_rates(
                default, pass_args.rates, pass_args.rate_step))

    def _specs(self, one_pass, pass_args):
        """(spec, whether it may start beside the runs of its group in
        flight, the runs its time is estimated from) of one pass."""
        runs = self.record["runs"]
        if not one_pass.get("grown"):
            for spec in self.study.plan(pass_args, runs):
                if (spec["phase"] in one_pass.get("phases", [spec["phase"]])
                        and (not one_pass.get("batches")
                             or spec["batch"] in one_pass["batches"])):
                    # A follow-up needs the best rate of its (optimizer,
                    # batch): it waits for that group's runs in flight.
                    yield spec, self._base_sweep(spec, pass_args), runs
        elif not self.grown_waiting:
            grown_runs = self.record["grown_runs"]
            for spec in grown_specs(self.settings, pass_args, grown_runs):
                yield spec, spec["phase"].endswith("_short"), [
                    r for r in grown_runs if r["policy"] == spec["policy"]]

    def next_task(self, busy, left):
        """The next run to start (a task dict), given the tasks in flight
        and the seconds left; None when nothing is left that fits."""
        key = self.study.run_key
        done = {key(r) for r in self.record["runs"]
                + self.record.get("grown_runs", [])}
        taken = {key(t["spec"]) for t in busy}
        groups = {_group(t["spec"]) for t in busy}
        for p in self.settings["passes"]:
            pass_args = study_args(self.settings, p, self.args)
            for spec, beside, history in self._specs(p, pass_args):
                # A run that would not end in time is left for the next call.
                if (key(spec) in done or key(spec) in taken
                        or _group(spec) in groups and not beside
                        or left < estimate(spec, history)):
                    continue
                return dict(spec=spec, args=vars(pass_args))
        return None

    def complete(self):
        """Nothing is left to run, not just nothing that fits."""
        return self.next_task([], float("inf")) is None and not (
            self.grown_waiting)

    def finished(self, task, value, now):
        """Records a run's result; returns the line to print."""
        runs = "grown_runs" if "policy" in task["spec"] else "runs"
        self.record[runs].append(dict(value, finished=now))
        self.record["claims"] = self.study.claims(self.record)
        return (f"c {self.study.run_key(value)}: val "
                f"{value['val_accuracy']:.4f} "
                f"({value['wall_seconds']:.0f} s)")


def _group(spec):
    return spec.get("policy"), spec["optimizer"], spec["batch"]
