"""One task of a localhost multi-worker job, driven by the tests.

Usage: `python mw_worker.py '<json>'`, with `TF_CONFIG` set for a worker
(absent for the single-process reference). JSON keys:

- `out`: `.npz` file written at the end: weights `w0`..`w3`, `evaluate`,
  `predict`, `epochs` (the epochs `fit` ran), `paths` and `buckets` (the
  all-reduce buckets traced: tensors, wire bytes);
- `strategy`: keyword arguments of `MultiWorkerMirroredStrategy`, or null
  for no strategy (single-process reference);
- `timeout`: collective timeout in seconds;
- `epochs`, `batch_size`: of `fit` (batch size is global);
- `backup_dir`: use `keras.callbacks.BackupAndRestore` there;
- `evaluate`: also run `evaluate` and `predict` on the first model
  (default true);
- `accumulation`: `{"steps": k, "optimizers": [...]}`: then train a fresh
  model per optimizer (`"sgd"`, `"lars_mixed"`, `"lamb_mixed"`) with
  `gradient_accumulation_steps=k`, under the same cross-device settings as
  the first; its results get the prefix `<name>_`;
- `then`: cross-device settings (`hierarchical_threshold_bytes`,
  `compression`) for one more fresh model, trained last in the same job;
  its results are saved with the prefix `then_`;
- `stop_after_epoch`: after this epoch's backup, write `<out>.ready` and
  exit (`stop_how="exit"`) or hang (`"hang"`, to be killed by the test);
  only on task `stop_task` when given.
"""

import dataclasses
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ARGS = json.loads(sys.argv[1])
TASK = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get(
    "index", 0
)

import tensorflow as tf  # noqa: E402

from keras_largebatch.distribute import MultiWorkerMirroredStrategy  # noqa: E402

strategy = None
if ARGS.get("strategy") is not None:
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=ARGS.get("timeout", 60)
    )
    strategy = MultiWorkerMirroredStrategy(
        communication_options=options, **ARGS["strategy"]
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_largebatch  # noqa: E402


def data():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 3))).argmax(axis=1).astype("int32")
    return x, y


def optimizer(name, **kwargs):
    if name == "sgd":
        return keras.optimizers.SGD(0.1, momentum=0.9, **kwargs)
    if name == "lamb_mixed":
        return keras_largebatch.LAMBMixed(0.01, weight_decay=1e-4, **kwargs)
    return keras_largebatch.LARSMixed(
        learning_rate=1.0, momentum=0.9, eta=0.01, weight_decay=1e-4,
        **kwargs,
    )


def build(name="lars_mixed", **kwargs):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=optimizer(name, **kwargs),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class Stop(keras.callbacks.Callback):
    def __init__(self, epoch, how, marker):
        super().__init__()
        self.epoch, self.how, self.marker = epoch, how, marker

    def on_epoch_end(self, epoch, logs=None):
        if epoch != self.epoch:
            return
        with open(self.marker, "w") as f:
            f.write("ready")
        if self.how == "exit":
            os._exit(3)
        import time

        while True:
            time.sleep(1)


class Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(epoch)


def train(prefix, x, y, *build_args, evaluate=False, **build_kwargs):
    """Builds, fits (and with `evaluate`, evaluates and predicts) a fresh
    model."""
    if strategy is not None:
        with strategy.scope():
            model = build(*build_args, **build_kwargs)
    else:
        model = build(*build_args, **build_kwargs)
    epochs = Epochs()
    callbacks = [epochs]
    if ARGS.get("backup_dir"):
        # Keras 3's BackupAndRestore is not multi-worker aware: one
        # directory per task.
        backup = os.path.join(ARGS["backup_dir"], f"task_{TASK}")
        callbacks.insert(0, keras.callbacks.BackupAndRestore(backup))
    if ARGS.get("stop_after_epoch") is not None and (
        ARGS.get("stop_task", TASK) == TASK
    ):
        callbacks.append(
            Stop(ARGS["stop_after_epoch"], ARGS.get("stop_how", "exit"),
                 ARGS["out"] + ".ready")
        )
    model.fit(
        x, y, batch_size=ARGS.get("batch_size", 16),
        epochs=ARGS.get("epochs", 2), shuffle=False, verbose=0,
        callbacks=callbacks,
    )
    result = {f"{prefix}w{i}": w for i, w in enumerate(model.get_weights())}
    result[f"{prefix}epochs"] = np.array(epochs.seen)
    if evaluate:
        result[f"{prefix}evaluate"] = np.array(
            model.evaluate(x, y, batch_size=16, verbose=0)
        )
        result[f"{prefix}predict"] = model.predict(x, batch_size=16, verbose=0)
    if strategy is not None:
        log = strategy.cross_device_ops.bucket_log
        result[f"{prefix}paths"] = np.array(
            sorted({b.reducer for b in log}), dtype=str
        )
        result[f"{prefix}buckets"] = np.array(
            [(b.tensors, b.wire_bytes) for b in log], dtype="int64"
        )
        log.clear()
    return result


def main():
    x, y = data()
    result = train("", x, y, evaluate=ARGS.get("evaluate", True))
    accumulation = ARGS.get("accumulation", {})
    for name in accumulation.get("optimizers", ()):
        result.update(train(
            f"{name}_", x, y, name,
            gradient_accumulation_steps=accumulation["steps"],
        ))
    if ARGS.get("then"):
        # Retrain a fresh model in the same job with other cross-device
        # settings (they are read when the train function is traced), last:
        # the models above train under the first settings.
        ops = strategy.cross_device_ops
        ops.config = dataclasses.replace(ops.config, **ARGS["then"])
        result.update(train("then_", x, y))
    np.savez(ARGS["out"], **result)


main()
