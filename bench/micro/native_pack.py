"""Native vs fallback pack/unpack time for ResNet-50's gradient set.

ResNet-50's trainable weights (`keras.applications.ResNet50(weights=None)`)
are packed into one buffer and unpacked back, inside `tf.function`, as the
fused all-reduce does: float32 -> float32, and float32 -> float16 scaled by
1/8 and back (fp16 transport). Medians over `--repeats` calls after a warm-up.

    python -m bench.micro.native_pack [--repeats 10]

Writes `bench/results/native_pack.json` (or `--out`).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
import tensorflow as tf

from bench import micro
from bench.micro.optimizer_step import median_ms
from keras_largebatch.distribute import native


def main():
    parser = micro.parser(__doc__, "native_pack")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    model = keras.applications.ResNet50(weights=None)
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.standard_normal(w.shape).astype(np.float32))
             for w in model.trainable_weights]
    shapes, dtypes = [g.shape for g in grads], [g.dtype for g in grads]
    nbytes = sum(int(np.prod(s)) * 4 for s in shapes)
    print(f"ResNet-50: {len(grads)} tensors, {nbytes / 2**20:.1f} MiB float32")

    f32, f16 = native.pack(grads), native.pack(grads, "float16")
    cases = {
        "pack float32": lambda u: native.pack(grads, use_native=u),
        "pack float32->float16 x1/8": lambda u: native.pack(
            grads, dtype="float16", scale=0.125, use_native=u),
        "unpack float32": lambda u: native.unpack(
            f32, shapes, dtypes, use_native=u),
        "unpack float16->float32 x8": lambda u: native.unpack(
            f16, shapes, dtypes, scale=8.0, use_native=u),
    }

    def sync(out):
        (out[-1] if isinstance(out, list) else out).numpy()

    rows = []
    for name, case in cases.items():
        row = {"case": name}
        for label, use_native in (("fallback", False), ("native", True)):
            if use_native and not native.native_ops_available():
                row[label + "_ms"] = None
                continue
            fn = tf.function(lambda c=case, u=use_native: c(u))
            row[label + "_ms"] = median_ms(fn, args.repeats, warmup=1,
                                           sync=sync)[0]
        rows.append(row)

    stamp = micro.stamp("native_pack", ["tensorflow"])
    print(f"\nMachine: {stamp['machine']}; TensorFlow {tf.__version__}; "
          f"medians of {args.repeats}\n")
    print("| case | fallback (ms) | native (ms) | native / fallback |")
    print("|---|---:|---:|---:|")
    for r in rows:
        n, f = r["native_ms"], r["fallback_ms"]
        ratio = f"{n / f:.2f}" if n else "n/a"
        print(f"| {r['case']} | {f:.1f} | {n if n is None else f'{n:.1f}'} | {ratio} |")

    out = {
        **stamp,
        "tensorflow": tf.__version__,
        "tensors": len(grads),
        "float32_bytes": nbytes,
        "repeats": args.repeats,
        "native_available": native.native_ops_available(),
        "rows": rows,
    }
    micro.write(args.out, out)


if __name__ == "__main__":
    main()
