"""Training images/s: our ResNet50 (v1, v1.5, no conv bias) vs Keras'.

Every configuration trains with the same backend, dtype policy, optimizer
(`keras_largebatch.LARSMixed`) and synthetic data; the step is Keras' own
compiled train step (`train_on_batch`, jitted on JAX/TF). Reported:
`batch / median(step time)` after the warm-up steps.

    python bench/applications.py --backend jax --size 64 --batch 32 --steps 5

The GPU claim (batch 256 at 224x224, mixed_float16, one H100) is
`--size 224 --batch 256 --precision mixed_float16 --steps 20`; it needs a
GPU. Prints a Markdown table and writes `bench/results/applications.json`.
"""

import argparse
import json
import os
import platform
import statistics
import time

# name -> ResNet50 kwargs; "keras" is keras.applications.ResNet50.
CONFIGS = {
    "keras": None,
    "v1": {"variant": "v1"},
    "v1.5": {"variant": "v1.5"},
    "v1-nobias": {"variant": "v1", "use_conv_bias": False},
    "v1.5-nobias": {"variant": "v1.5", "use_conv_bias": False},
}
LABELS = {
    "keras": "keras.applications.ResNet50",
    "v1": "ours, v1",
    "v1.5": "ours, v1.5",
    "v1-nobias": "ours, v1, use_conv_bias=False",
    "v1.5-nobias": "ours, v1.5, use_conv_bias=False",
}


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="jax",
                   choices=["jax", "tensorflow", "torch"])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--precision", default="float32",
                   choices=["float32", "mixed_float16", "mixed_bfloat16"])
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results",
        "applications.json"))
    return p.parse_args()


def _measure(name, kwargs, args):
    import keras
    import numpy as np

    from keras_largebatch import LARSMixed
    from keras_largebatch.applications import ResNet50

    shape = (args.size, args.size, 3)
    if kwargs is None:
        model = keras.applications.ResNet50(weights=None, input_shape=shape)
    else:
        model = ResNet50(input_shape=shape, **kwargs)
    model.compile(
        optimizer=LARSMixed(learning_rate=0.1, weight_decay=5e-5),
        loss="sparse_categorical_crossentropy",
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.batch,) + shape).astype("float32")
    y = rng.integers(0, 1000, (args.batch,))
    if args.backend != "torch":
        x, y = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        model.train_on_batch(x, y)
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        model.train_on_batch(x, y)  # returns Python floats: synchronizes
        times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    return {
        "config": name,
        "model": LABELS[name],
        "params": model.count_params(),
        "median_step_s": step,
        "images_per_s": args.batch / step,
        "warmup_s": warmup_s,
    }


def _device(backend):
    if backend == "jax":
        import jax

        return str(jax.devices()[0])
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        return "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return gpus[0].name if gpus else "cpu"


def main():
    args = _args()
    os.environ["KERAS_BACKEND"] = args.backend
    import keras

    keras.config.set_dtype_policy(args.precision)
    from keras_largebatch._shared import require

    names = [n.strip() for n in args.configs.split(",")]
    require(all(n in CONFIGS for n in names), "--configs", args.configs,
            f"names from {list(CONFIGS)}")
    load_before = os.getloadavg()
    rows = [_measure(n, CONFIGS[n], args) for n in names]
    load_after = os.getloadavg()
    base = rows[0]["images_per_s"]
    print(f"\nResNet-50 training, {args.backend}, {args.precision}, "
          f"LARSMixed, {args.size}x{args.size}, batch {args.batch}, "
          f"median of {args.steps} steps, device {_device(args.backend)}, "
          f"{os.cpu_count()} CPU cores\n")
    print("| model | params | images/s | vs first row |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params']:,} | {r['images_per_s']:.1f} "
              f"| {r['images_per_s'] / base:.2f}x |")
    result = {
        "claim": "training images/s of keras_largebatch ResNet50 vs "
                 "keras.applications.ResNet50, same backend/precision/"
                 "optimizer (LARSMixed), synthetic data",
        "machine": {"platform": platform.platform(),
                    "processor": platform.processor(),
                    "cpu_count": os.cpu_count(),
                    "device": _device(args.backend),
                    "loadavg_1_5_15_before": load_before,
                    "loadavg_1_5_15_after": load_after},
        "keras": keras.__version__,
        "args": vars(args),
        "results": rows,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    from keras_largebatch._shared import atomic_write

    atomic_write(args.out, json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
