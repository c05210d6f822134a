"""One task of the fp16-transport check, driven by the tests.

Usage: `python fp16_worker.py <out.npz>`, with `TF_CONFIG` set. Under
`mixed_float16`, a fresh MLP takes one `LARSMixed` step (`fit`, one batch
of 8 per worker) with small gradients (elements ~1e-6..1e-4), first with
float32 transport, then, from the same initial weights, with
`compression="fp16"`. Writes `w0_<i>` (initial weights), `f32_<i>` and
`fp16_<i>` (after the step), and the buckets each step traced.
"""

import dataclasses
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from keras_largebatch.distribute import MultiWorkerMirroredStrategy  # noqa: E402
from keras_largebatch.distribute import compression  # noqa: E402

strategy = MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=120
    )
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_largebatch  # noqa: E402

keras.mixed_precision.set_global_policy("mixed_float16")


def small_loss(y, p):
    # Gradients of 1e-6..1e-4 per element: below float16's normal range
    # once divided by the number of replicas, unless loss-scaled.
    return 1e-3 * keras.losses.mean_squared_error(y, p)


def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(4),
    ])
    model.compile(
        optimizer=keras_largebatch.LARSMixed(
            learning_rate=1.0, momentum=0.9, eta=0.01
        ),
        loss=small_loss,
    )
    return model


def step():
    with strategy.scope():
        model = build()
    w0 = model.get_weights()
    rng = np.random.RandomState(0)
    n = strategy.num_replicas_in_sync
    x = rng.normal(size=(8 * n, 16)).astype("float32")
    y = rng.normal(size=(8 * n, 4)).astype("float32")
    model.fit(x, y, batch_size=8 * n, epochs=1, shuffle=False, verbose=0)
    log = [(b.tensors, b.wire_bytes)
           for b in strategy.cross_device_ops.bucket_log]
    strategy.cross_device_ops.bucket_log.clear()
    return w0, model.get_weights(), log


def main():
    result = {}
    w0, result_f32, log_f32 = step()
    ops = strategy.cross_device_ops
    ops.config = dataclasses.replace(
        ops.config, compression=compression.FP16Compressor
    )
    _, result_fp16, log_fp16 = step()
    for i, w in enumerate(w0):
        result[f"w0_{i}"] = w
        result[f"f32_{i}"] = result_f32[i]
        result[f"fp16_{i}"] = result_fp16[i]
    result["buckets_f32"] = np.array(log_f32, "int64")
    result["buckets_fp16"] = np.array(log_fp16, "int64")
    np.savez(sys.argv[1], **result)


main()
