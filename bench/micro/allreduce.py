"""All-reduce of ResNet-50's gradient set on localhost multi-worker clusters.

For 2 and 4 worker subprocesses on 127.0.0.1, ResNet-50's 214 gradients
(97.6 MiB float32) are all-reduced (SUM) by TensorFlow's own
`CollectiveAllReduce` (`per tensor`, `TF default`, `TF 25 MB` packs), by
this package's fused all-reduce at the strategy's defaults (`ours f32`,
`ours fp16`; `ours f32 <k> MiB` buckets; `ours topk 1%`, `ours topk 0.1%`)
and as one ready-made buffer (`flat buffer`); the table shows the median
over `--runs` of the slowest worker. Then a 2-worker training step under
this package's strategy and stock `tf.distribute.MultiWorkerMirroredStrategy`.
The claims and the results: docs/benchmarks.md.

Usage: `python -m bench.micro.allreduce [--runs 5] [--workers 2 4]`.
Writes `bench/results/allreduce.json` (or `--out`).
"""

import json
import os
import statistics
import time

from keras_largebatch._shared import atomic_write

from bench import micro

METHODS = ["per tensor", "TF default", "TF 25 MB", "ours f32", "ours fp16",
           "ours topk 1%", "ours topk 0.1%", "flat buffer"]


def _launch(n, mode, args):
    return micro.workers(
        "allreduce", "tensorflow", n,
        lambda out: ("--mode", mode, "--args", json.dumps(dict(args, out=out))),
        900, TF_CPP_MIN_LOG_LEVEL="2")


def _slowest_ms(per_worker):
    """The median over runs of the slowest worker's seconds, in ms."""
    return round(1000 * statistics.median(map(max, zip(*per_worker))), 1)


def worker_allreduce(args):
    import dataclasses

    import numpy as np
    import tensorflow as tf

    from keras_largebatch.distribute import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy()
    # TensorFlow's own CollectiveAllReduce, the baseline, is not public.
    from tensorflow.python.distribute import cross_device_ops as cdo

    ops = strategy.cross_device_ops
    defaults = ops.config
    tf_ops = cdo.CollectiveAllReduce(
        strategy.extended.worker_devices, ops.group_size, ops.options,
        ops.collective_keys)
    device = strategy.extended.worker_devices[0]
    sum_ = tf.distribute.ReduceOp.SUM
    Options = tf.distribute.experimental.CommunicationOptions
    rng = np.random.RandomState(0)
    with tf.device(device):
        grads = [tf.constant(rng.normal(size=s).astype("float32"))
                 for s in args["shapes"]]
        flat = tf.constant(rng.normal(size=sum(
            int(np.prod(s)) for s in args["shapes"])).astype("float32"))
        one = tf.constant([1.0])

    def tf_pack(bytes_per_pack):
        options = Options(bytes_per_pack=bytes_per_pack)
        return lambda: tf_ops._all_reduce(sum_, grads, 0, options)

    def ours(**changes):
        config = dataclasses.replace(defaults, **changes)

        def run():
            # Read at trace time: set before each function is traced.
            ops.config = config
            return ops.reduce_replica(sum_, grads, 0, Options(), True)

        return run

    fns = {
        "per tensor": tf_pack(1),
        "TF default": tf_pack(0),
        "TF 25 MB": tf_pack(25 * 10**6),
        "ours f32": ours(compression=None),
        "ours fp16": ours(compression="fp16"),
        "ours topk 1%": ours(compression="topk", topk_density=0.01),
        "ours topk 0.1%": ours(compression="topk", topk_density=0.001),
        "flat buffer": lambda: tf_ops._launchers[0].all_reduce(flat),
    }
    for name in args["methods"]:
        words = name.split()  # ["ours", "f32" or "fp16", "<k>", "MiB"]
        if name not in fns and words[-1] == "MiB":
            fns[name] = ours(
                compression={"f32": None, "fp16": "fp16"}[words[1]],
                fusion_threshold_bytes=int(float(words[2]) * 2**20))
    barrier = tf.function(lambda: tf_ops._launchers[0].all_reduce(one))
    times = {}
    for name in args["methods"]:
        with tf.device(device):
            fn = tf.function(fns[name])
            fn()  # trace + warm-up
            times[name] = []
            for _ in range(args["runs"]):
                barrier().numpy()
                start = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy(), fn())
                times[name].append(time.perf_counter() - start)
    atomic_write(args["out"], json.dumps({"times": times}))


def worker_step(args):
    import tensorflow as tf

    from keras_largebatch.distribute import MultiWorkerMirroredStrategy

    if args["strategy"] == "ours":
        kwargs = {}
        if args["fusion_mb"]:
            kwargs["fusion_threshold_bytes"] = int(args["fusion_mb"] * 2**20)
        strategy = MultiWorkerMirroredStrategy(**kwargs)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    with strategy.scope():
        model = keras.applications.ResNet50(
            weights=None, input_shape=(32, 32, 3), classes=10)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="sum")
    batch = args["batch"]
    x = tf.random.stateless_uniform((batch, 32, 32, 3), (1, 2))
    y = tf.random.stateless_uniform((batch,), (3, 4), maxval=10,
                                    dtype=tf.int32)
    global_batch = batch * strategy.num_replicas_in_sync

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True)) / global_batch
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica), axis=None)

    for _ in range(2):
        step().numpy()
    runs = []
    for _ in range(args["steps"]):
        start = time.perf_counter()
        step().numpy()
        runs.append(time.perf_counter() - start)
    atomic_write(args["out"], json.dumps({"times": runs}))


def main():
    parser = micro.parser(__doc__, "allreduce")
    parser.add_argument("--mode", default="launch")
    parser.add_argument("--args", default="{}")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--fusion_mb", type=float, default=None,
        help="bucket size of the training step (default: the strategy's)")
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip_step", action="store_true")
    parser.add_argument("--skip_allreduce", action="store_true")
    flags = parser.parse_args()
    workers = {"allreduce": worker_allreduce, "step": worker_step}
    if flags.mode in workers:
        return workers[flags.mode](json.loads(flags.args))

    import keras
    import numpy as np

    from keras_largebatch import distribute
    from keras_largebatch.distribute import native

    model = keras.applications.ResNet50(weights=None)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    mb = sum(int(np.prod(s)) for s in shapes) * 4 / 2**20
    stamp = micro.stamp("allreduce", ["tensorflow"])
    result = {
        **stamp, "machine": stamp["machine"] + ", loopback gRPC",
        "load_average": os.getloadavg(),
        "tensors": len(shapes), "mebibytes": round(mb, 1),
        "runs": flags.runs,
        "default_fusion_threshold_mib": distribute.FUSION_THRESHOLD_BYTES
        / 2**20,
        "native_ops": native.native_ops_available(),
        "allreduce_ms": {}, "ratio_to_tf_best": {}, "step_ms": {},
    }
    for n in [] if flags.skip_allreduce else flags.workers:
        outs = _launch(n, "allreduce", {
            "shapes": shapes, "runs": flags.runs, "methods": flags.methods})
        result["allreduce_ms"][n] = {
            m: _slowest_ms([o["times"][m] for o in outs])
            for m in flags.methods}
    if not flags.skip_step:
        for name in ("stock", "ours"):
            outs = _launch(2, "step", {
                "strategy": name, "batch": 8, "steps": flags.steps,
                "fusion_mb": flags.fusion_mb})
            result["step_ms"][name] = _slowest_ms([o["times"] for o in outs])

    print(f"\nResNet-50 gradients: {len(shapes)} tensors, {mb:.1f} MiB "
          f"float32; {result['machine']}; median of {flags.runs}\n")
    print("| workers | " + " | ".join(flags.methods) + " |")
    print("|---" * (len(flags.methods) + 1) + "|")
    for n, row in result["allreduce_ms"].items():
        print(f"| {n} | " + " | ".join(f"{row[m]:,.0f} ms" for m in
                                       flags.methods) + " |")
    for n, row in result["allreduce_ms"].items():
        best = min(row.get("TF default", 1e9), row.get("TF 25 MB", 1e9))
        ratios = result["ratio_to_tf_best"][n] = {
            m: round(ms / best, 3) for m, ms in row.items()
            if m.startswith("ours") and best < 1e9}
        for m, ratio in ratios.items():
            print(f"{n} workers: {m} / TF's best = {ratio:.2f}")
    result["load_average_after"] = os.getloadavg()
    if result["step_ms"]:
        print("\n| 2-worker train step (ResNet-50 32x32, batch 8/worker) "
              "| ms |\n|---|---|")
        for name, ms in result["step_ms"].items():
            label = ("stock tf.distribute.MultiWorkerMirroredStrategy"
                     if name == "stock" else "keras_largebatch strategy")
            print(f"| {label} | {ms:,.0f} |")
    micro.write(flags.out, result)


if __name__ == "__main__":
    main()
