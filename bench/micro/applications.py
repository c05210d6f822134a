"""Training images/s: our ResNet50 (v1, v1.5, no conv bias) vs Keras'.

Each configuration with the same backend, dtype policy and optimizer
(`LARSMixed`): `fit_images_per_s`, which the GPU check reuses. The GPU
claim is `--size 224 --batch 256 --precision mixed_float16 --steps 20`.

    python -m bench.micro.applications --backend jax --size 64 --batch 32 --steps 5

Prints a Markdown table and writes `bench/results/applications.json`.
"""

import os
import statistics
import sys
import time

from bench import micro

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
    "cifar8": "ours, ResNet-8 (width 4)",
}


def build_model(name, size, classes=1000):
    """The ResNet-50 of `CONFIGS[name]` for `size` x `size` images
    (`"cifar8"`: the package's ResNet-8 of width 4, for smoke runs)."""
    import keras

    from keras_largebatch.applications import ResNet50
    from keras_largebatch.applications import ResNetCIFAR

    shape = (size, size, 3)
    if name == "cifar8":
        return ResNetCIFAR(depth=8, width=4, input_shape=shape,
                           classes=classes)
    if CONFIGS[name] is None:
        return keras.applications.ResNet50(
            weights=None, input_shape=shape, classes=classes)
    return ResNet50(input_shape=shape, classes=classes, **CONFIGS[name])


def fit_images_per_s(model, optimizer, batch, size, steps, warmup,
                     classes=1000, jit_compile="auto"):
    """Images/s of `model.fit`'s compiled train step with `optimizer`
    (`jit_compile` as `model.compile` takes it): one synthetic batch on the
    device, fed every step (no input pipeline or copy is timed), `batch /
    median(step time)` over the last `steps` of `warmup + steps`; and the
    seconds from `fit`'s start to the end of its first step (compilation
    included)."""
    import keras
    import numpy as np

    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(
        rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32"))
    y = keras.ops.convert_to_tensor(
        rng.integers(0, classes, (batch,)).astype("int32"))

    def same_batch():
        while True:
            yield x, y

    ends = []

    class StepEnds(keras.callbacks.Callback):
        # A batch-end hook makes Keras call it synchronously, with the logs
        # as Python floats: each time is taken once the step's loss is on
        # the host. The first is said at once (a run stopped while it
        # compiles says so by its absence).
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())
            if len(ends) == 1:
                print(f"first step after {ends[0] - start:.1f} s",
                      file=sys.stderr, flush=True)

    start = time.perf_counter()
    model.fit(same_batch(), steps_per_epoch=warmup + steps, epochs=1,
              callbacks=[StepEnds()], verbose=0, shuffle=False)
    ends.insert(0, start)
    times = [b - a for a, b in zip(ends[warmup:], ends[warmup + 1:])]
    step = statistics.median(times)
    return {
        "params": model.count_params(),
        "median_step_s": step,
        "images_per_s": batch / step,
        "first_step_s": ends[1] - start,
        "warmup_s": ends[warmup] - start,
        "steps": len(times),
    }


def device_name(backend):
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {device.device_kind}"
    if backend == "torch":
        import torch

        return (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                else "cpu")
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return gpus[0].name if gpus else "cpu"


def main():
    p = micro.parser(__doc__, "applications")
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
    args = p.parse_args()
    os.environ["KERAS_BACKEND"] = args.backend
    import keras

    keras.config.set_dtype_policy(args.precision)
    from keras_largebatch import LARSMixed
    from keras_largebatch._shared import require

    names = [n.strip() for n in args.configs.split(",")]
    require(all(n in CONFIGS for n in names), "--configs", args.configs,
            f"names from {list(CONFIGS)}")
    load_before = os.getloadavg()
    rows = []
    for name in names:
        result = fit_images_per_s(
            build_model(name, args.size),
            LARSMixed(learning_rate=0.1, weight_decay=5e-5), args.batch,
            args.size, args.steps, args.warmup)
        rows.append(dict(config=name, model=LABELS[name], **result))
    load_after = os.getloadavg()
    base, device = rows[0]["images_per_s"], device_name(args.backend)
    print(f"\nResNet-50 training, {args.backend}, {args.precision}, "
          f"LARSMixed, {args.size}x{args.size}, batch {args.batch}, "
          f"median of {args.steps} steps, device {device}, "
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
        **micro.stamp("applications", [args.backend]),
        "device": device,
        "loadavg_1_5_15_before": load_before,
        "loadavg_1_5_15_after": load_after,
        "keras": keras.__version__,
        "args": vars(args),
        "results": rows,
    }
    micro.write(args.out, result)


if __name__ == "__main__":
    main()
