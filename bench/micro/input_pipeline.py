"""Input pipeline throughput: decoded, augmented images/s per CPU core.

Synthetic JPEGs at ImageNet's sizes in TFRecord shards, read by the
command's `train` and `eval` pipelines and a plain `decode+resize` at each
of `--sizes`, tf.data's threads at 1 and at all cores; per core: images per
CPU-second of this process. `--fashion_mnist` compares tf.data and Grain
instead. The method and the results: docs/benchmarks.md.

    python -m bench.micro.input_pipeline [--images 384] [--sizes 224,67]
    python -m bench.micro.input_pipeline --fashion_mnist [--batch 256]

Writes `bench/results/input_pipeline.json` (`--fashion_mnist`:
`input_pipeline_fashion_mnist.json`), or `--out`.
"""

import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import bench
from bench import micro
from bench.core import provenance
from keras_largebatch.train.data import imagenet

MACHINE = provenance.machine("tensorflow")
SHAPES = [(375, 500), (500, 375), (333, 500), (480, 640), (300, 400),
          (500, 500), (281, 500), (375, 500)]


def _photo_like(rng, height, width):
    # Smooth shapes plus mild noise: JPEGs of ~100 KB at ImageNet sizes,
    # close to real photos' (noise alone compresses far worse).
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    image = np.zeros((height, width, 3))
    for c in range(3):
        f = rng.uniform(2, 9, size=2)
        image[..., c] = 128 + 90 * np.sin(f[0] * x * 6 + c) * np.cos(
            f[1] * y * 6 - c)
    image += rng.normal(0, 12, image.shape)
    return np.clip(image, 0, 255).astype("uint8")


def write_shards(folder, num_images, num_files=4):
    rng = np.random.default_rng(0)
    sizes = []
    per_file = -(-num_images // num_files)
    for i in range(num_files):
        path = os.path.join(folder, f"train-{i:05d}-of-{num_files:05d}")
        with tf.io.TFRecordWriter(path) as writer:
            for j in range(per_file):
                h, w = SHAPES[(i * per_file + j) % len(SHAPES)]
                encoded = tf.io.encode_jpeg(_photo_like(rng, h, w),
                                            quality=90).numpy()
                sizes.append(len(encoded))
                feature = {
                    "image/encoded": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[encoded])),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[1 + j % 5]))}
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)), sizes


def pipeline(kind, paths, size):
    records = imagenet.read(paths, 1000)
    if kind == "train":
        def fn(i, record):
            encoded, label = imagenet.parse(record, 1000)
            seed = tf.random.experimental.stateless_fold_in(
                tf.constant([0, 1], "int64"), i)
            return imagenet.decode_train(encoded, size, seed), label
        return records.enumerate().map(fn, num_parallel_calls=tf.data.AUTOTUNE)

    def fn(record):
        encoded, label = imagenet.parse(record, 1000)
        if kind == "eval":
            return imagenet.decode_eval(encoded, size), label
        image = tf.io.decode_jpeg(encoded, channels=3)
        return tf.image.resize(image, (size, size)) / 255.0, label

    return records.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def dataset(kind, paths, size, threads):
    ds = pipeline(kind, paths, size).batch(32)
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    ds = ds.with_options(options)
    for _ in ds.take(1):  # Warm up: trace, open files.
        pass
    return ds


def measure(ds):
    """(images per wall second, images per CPU second of this process)."""
    wall, cpu, count = time.perf_counter(), time.process_time(), 0
    for x, _ in ds:
        count += int(x.shape[0])
    return (count / (time.perf_counter() - wall),
            count / (time.process_time() - cpu))


def write(path, name, **fields):
    """`path` (default `bench/results/<name>.json`): the machine, the date,
    the command, `fields`."""
    micro.write(path or os.path.join(bench.ROOT, "bench", "results",
                                     name + ".json"),
                dict(micro.stamp("input_pipeline", ["tensorflow"]), **fields))


def fashion_mnist(args):
    """tf.data against Grain on Fashion-MNIST with augmentation."""
    from keras_largebatch.train.data import augment
    from keras_largebatch.train.data import augment_numpy
    from keras_largebatch.train import data
    from keras_largebatch.train.data import grain_pipeline

    spec = data.load("fashion_mnist", 28, channels=None)
    steps = spec.num_train // args.batch
    builds = {
        "tf.data": lambda: data.batch(
            spec, args.batch, augment.build("light", 28), drop_remainder=True,
            steps_per_epoch=steps)[0],
        "grain": lambda: grain_pipeline.batch(
            spec, args.batch, augment_numpy.build("light"),
            drop_remainder=True, steps_per_epoch=steps)[0],
    }
    best = {name: 0.0 for name in builds}
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        for name, build in builds.items():
            best[name] = max(best[name], measure(build())[0])
    load_after = os.getloadavg()
    ratio = best["grain"] / best["tf.data"]
    print(f"\nMachine: {MACHINE}; Fashion-MNIST, {steps} batches of "
          f"{args.batch}, light augmentation; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after\n")
    print("| pipeline | images/s (wall) |\n|---|---:|")
    for name, rate in best.items():
        print(f"| {name} | {rate:.0f} |")
    print(f"\nGrain / tf.data: {ratio:.2f} (target >= 0.9)")
    write(args.out, "input_pipeline_fashion_mnist", tensorflow=tf.__version__,
          batch=args.batch, batches=steps, repeats=args.repeats,
          load_average_before_after=[load_before[0], load_after[0]],
          images_per_sec=best, grain_over_tf_data=ratio)


def main():
    parser = micro.parser(__doc__, None)
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--sizes", default="224,67")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fashion_mnist", action="store_true")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    if args.fashion_mnist:
        return fashion_mnist(args)
    cores = os.cpu_count()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        paths, jpeg_bytes = write_shards(folder, args.images)
        configs = [(kind, size, threads)
                   for size in [int(s) for s in args.sizes.split(",")]
                   for kind in ("train", "eval", "decode+resize")
                   for threads in sorted({1, cores})]
        datasets = {c: dataset(c[0], paths, c[1], c[2]) for c in configs}
        best = {c: (0.0, 0.0) for c in configs}
        # Round robin, best of --repeats: other jobs' load shifts over time.
        for _ in range(args.repeats):
            for c in configs:
                wall, cpu = measure(datasets[c])
                best[c] = (max(best[c][0], wall), max(best[c][1], cpu))
    rows = [{"pipeline": kind, "size": size, "threads": threads,
             "images_per_sec": wall, "images_per_cpu_sec": cpu}
            for (kind, size, threads), (wall, cpu) in best.items()]
    load_after = os.getloadavg()
    print(f"\nMachine: {MACHINE}; TensorFlow {tf.__version__}; "
          f"{len(jpeg_bytes)} JPEGs, mean {np.mean(jpeg_bytes) / 1e3:.0f} KB; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} "
          f"after\n")
    print("| pipeline | size | threads | images/s (wall) | "
          "images per CPU-second (per core) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['pipeline']} | {r['size']} | {r['threads']} | "
              f"{r['images_per_sec']:.0f} | {r['images_per_cpu_sec']:.0f} |")
    per_core = max(r["images_per_cpu_sec"] for r in rows
                   if r["pipeline"] == "train" and r["size"] == 224)
    print(f"\nAn H100 at 6,500 images/s (ResNet-50, 224x224) needs "
          f"{6500 / per_core:.0f} such cores for the training pipeline.")
    write(args.out, "input_pipeline", tensorflow=tf.__version__,
          jpegs=len(jpeg_bytes), mean_jpeg_bytes=float(np.mean(jpeg_bytes)),
          load_average_before_after=[load_before[0], load_after[0]],
          rows=rows, repeats=args.repeats,
          cores_for_6500_images_per_sec_at_224=6500 / per_core)


if __name__ == "__main__":
    main()
