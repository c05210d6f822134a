"""The parts of `bench/gpu_campaign.py` that worker processes run: each a
list of tasks (JSON dicts), run by `TASKS[part](task)`. Part c is no
worker task: `gpu_campaign.py`'s `run_c` hands a plan to the study's runner.
"""

import importlib.util
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Part a's optimizers: the name a result records, and the optimizer's in
# `bench/micro/optimizer_step.py`'s `optimizers()`, which makes it.
OPTIMIZERS = {
    "lso_sgd": ("LossScaleOptimizer(SGD(0.1, momentum=0.9))", "LSO(SGD)"),
    "lars_mixed": ("LARSMixed(0.1, momentum=0.9, weight_decay=5e-5)",
                   "LARSMixed"),
    "lamb_mixed": ("LAMBMixed(1e-3, weight_decay=1e-2)", "LAMBMixed"),
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
# The torch step Keras compiles (`jit_compile=True`, torch.compile), run
# before part a: stock against LARSMixed, each against eager torch and JAX.
COMPILED_ITEMS = [("torch", "keras", "lso_sgd"), ("torch", "keras", "lars_mixed")]
SMOKE_A = [("jax", "keras", "lso_sgd"), ("torch", "keras", "lso_sgd"),
           ("torch", "keras", "lars_mixed"), ("torch", "v1", "lamb_mixed")]
# torch.compile of a ResNet-50 takes minutes on a CPU: the smoke compiles
# the package's ResNet-8 through the same code.
SMOKE_COMPILED = [("torch", "cifar8", "lars_mixed")]
SMOKE = dict(
    a=dict(size=32, batch=2, steps=2, warmup=1, precision="mixed_float16"),
    b=dict(steps=2, optimizers=["LSO(SGD)", "LARSMixed"]),
)


def bench_module(name):
    """`bench/<name>.py`, imported by its path (the repository's top-level
    `applications/` package must not shadow `bench/micro/applications.py`)."""
    key = "bench_" + name
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            key, os.path.join(HERE, "micro", name + ".py"))
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


def task_a(task):
    import keras

    apps = bench_module("applications")
    s = task["settings"]
    keras.backend.clear_session()
    keras.config.set_dtype_policy(s["precision"])
    model = apps.build_model(task["model"], s["size"])
    first = time_first_step(model, task["key"])
    label, name = OPTIMIZERS[task["optimizer"]]
    optimizer = bench_module("optimizer_step").optimizers()[name]()
    result = apps.fit_images_per_s(
        model, optimizer, s["batch"], s["size"], s["steps"], s["warmup"],
        jit_compile=True if task.get("compiled") else "auto")
    keras.config.set_dtype_policy("float32")
    return dict(result, first_step_s=first.get("seconds"),
                model=apps.LABELS[task["model"]], optimizer=label)


def time_first_step(model, key):
    """A dict that gets `seconds`: from `fit`'s making of the train
    function to the end of the first step (compilation included), also
    logged at once, so that an item that runs out of time says whether it
    compiled. Only the first call is wrapped."""
    import keras

    timing = {}
    make = model.make_train_function

    def make_timed(force=False):
        start = time.perf_counter()
        make(force)
        function = model.train_function
        if timing or function is None or getattr(function, "timed", False):
            return

        def first_call(*args, **kwargs):
            out = function(*args, **kwargs)
            # Waits for the step: one leaf's value leaves the device.
            keras.ops.convert_to_numpy(keras.tree.flatten(out)[0])
            timing["seconds"] = time.perf_counter() - start
            print(f"{key}: first step after {timing['seconds']:.1f} s",
                  file=sys.stderr, flush=True)
            model.train_function = function
            return out

        first_call.timed = True
        model.train_function = first_call

    model.make_train_function = make_timed
    return timing


def task_b(task):
    _, ms = bench_module("optimizer_step").measure_backend(
        task["settings"]["steps"], task["settings"]["optimizers"])
    return ms


TASKS = {"a": task_a, "b": task_b, "compiled": task_a}
