"""Cost of `GradientNoiseScale`: a training step of `fit` with and without it.

Per backend, `fit` of each of `--models` (`mlp_4x1024` is the worst case)
alternately without the noise scale and with it every `--intervals`
updates: the median step time after `--warmup` steps, wall and CPU, and
the overhead. The method and the results: docs/benchmarks.md.

    python -m bench.micro.noise_scale_cost
    python -m bench.micro.noise_scale_cost --backends jax --steps 40 --intervals 1 4

Prints a Markdown table and writes bench/results/noise_scale_cost.json (or
`--out`).
"""

import argparse
import os
import statistics
import sys
import time

import bench
from bench import micro


def build(name):
    import keras

    if name == "resnet_cifar_8x4":
        from keras_largebatch import applications

        model = applications.ResNetCIFAR(8, 4, input_shape=(28, 28, 1),
                                         classes=10)
        return model, (28, 28, 1)
    layers = [keras.Input((1024,))]
    layers += [keras.layers.Dense(1024, activation="relu") for _ in range(3)]
    layers += [keras.layers.Dense(10)]
    return keras.Sequential(layers), (1024,)


def measure_backend(steps, warmup, repeats, intervals, models, batch=64):
    import keras
    import numpy as np

    import keras_largebatch as klb

    class Timer(keras.callbacks.Callback):
        """(wall, CPU) time after `warmup` steps (`start`) and at the
        epoch's end (`end`)."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == warmup - 1:
                self.start = (time.perf_counter(), time.process_time())

        def on_epoch_end(self, epoch, logs=None):
            keras.ops.convert_to_numpy(self.model.optimizer.iterations)
            self.end = (time.perf_counter(), time.process_time())

    out = {}
    for name in models:
        # One model per setting: the callback's wrapper stays on the model.
        runs = {}
        for interval in [None] + list(intervals):
            keras.utils.set_random_seed(0)
            model, shape = build(name)
            optimizer = keras.optimizers.SGD(0.01, momentum=0.9,
                                             gradient_accumulation_steps=2)
            callbacks = []
            if interval is not None:
                optimizer = klb.NoiseScaleOptimizer(optimizer,
                                                    interval=interval)
                callbacks = [klb.GradientNoiseScale(batch)]
            model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(
                from_logits=True))
            runs[interval] = (model, callbacks, [])
        x = np.random.rand(batch * steps, *shape).astype("float32")
        y = np.random.randint(0, 10, batch * steps)
        for _ in range(repeats):
            for model, callbacks, times in runs.values():
                timer = Timer()
                model.fit(x, y, batch_size=batch, epochs=1, verbose=0,
                          shuffle=False, callbacks=callbacks + [timer])
                times.append([(e - s) * 1000 / (steps - warmup)
                              for s, e in zip(timer.start, timer.end)])
        # The median wall and CPU ms of each setting.
        ms = {k: [statistics.median(t) for t in zip(*times)]
              for k, (_, _, times) in runs.items()}
        row = {"params": runs[None][0].count_params(),
               "plain_ms": ms[None][0], "plain_cpu_ms": ms[None][1]}
        for interval in intervals:
            wall, cpu = ms[interval]
            row[f"gns_every_{interval}"] = {
                "ms": wall, "cpu_ms": cpu,
                "overhead_pct": 100 * (wall / row["plain_ms"] - 1),
                "overhead_cpu_pct": 100 * (cpu / row["plain_cpu_ms"] - 1)}
        out[name] = row
    return out


def main():
    p = micro.parser(__doc__, "noise_scale_cost")
    p.add_argument("--backends", nargs="+",
                   default=["tensorflow", "jax", "torch"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 4])
    p.add_argument("--models", nargs="+",
                   default=["resnet_cifar_8x4", "mlp_4x1024"])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return bench.say(measure_backend(args.steps, args.warmup,
                                         args.repeats, args.intervals,
                                         args.models))
    results = {b: micro.child("noise_scale_cost", b, "--child", *sys.argv[1:])
               for b in args.backends}
    print("| backend | model | params | step ms | every | with GNS ms | "
          "overhead (wall) | overhead (CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for backend, rows in results.items():
        for name, r in rows.items():
            for interval in args.intervals:
                g = r[f"gns_every_{interval}"]
                print(f"| {backend} | {name} | {r['params']:,} | "
                      f"{r['plain_ms']:.2f} | {interval} | {g['ms']:.2f} | "
                      f"{g['overhead_pct']:+.1f}% | "
                      f"{g['overhead_cpu_pct']:+.1f}% |")
    micro.write(args.out, dict(
        results=results,
        args={k: v for k, v in vars(args).items()
              if k not in ("child", "out")},
        **micro.stamp("noise_scale_cost", args.backends),
        loadavg=os.getloadavg()[0]), indent=1)


if __name__ == "__main__":
    main()
