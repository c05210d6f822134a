"""One task of a localhost job under `compression="topk"`, driven by
`test_distribute_topk.py`.

Usage: `python topk_worker.py '<json>'`, with `TF_CONFIG` set. One strategy
serves a list of runs, one after another in this process (a TensorFlow
worker's start costs seconds of import and cluster set-up). JSON keys:

- `out`: path prefix; run `name` writes `<out>_<name>.npz` when it ends;
- `strategy`: keyword arguments of `MultiWorkerMirroredStrategy` shared by
  every run (`workers_per_node` is read once, at its construction);
- `timeout`: collective timeout in seconds (default 120);
- `runs`: the runs, in order. Each holds `name`, `mode`, `strategy` (more
  keyword arguments for this run alone, on top of the shared ones) and the
  keys of its mode. Each starts from a fresh `ReduceConfig` of those
  arguments and fresh (empty) top-k residuals, as a new job would.
- `mode`:
  - `"reduce"`: all-reduces (SUM) `steps` sets of gradients of `SHAPES`
    with `ReplicaContext.all_reduce` in a `tf.function`; task `t` at step
    `s` sends `gradients(t, s)`. Saves `g{s}` (its gradients), `y{s}` (the
    result) and `r{s}_{i}` (its residual of gradient `i` after step `s`).
    `first_step` numbers the steps; `restore` / `save`: a
    `tf.train.Checkpoint` of `strategy.topk_residuals` restored before the
    first step / written after the last (the path gets `_<task>`).
  - `"train"`: Keras `fit` of a teacher-student MLP (`optimizer` "sgd" or
    "lars_mixed"); saves the per-epoch `loss`, the final full-data
    `final_loss`, the weights `w0`..., the residuals; with `residual_dir`
    the residuals are checkpointed per epoch there and restored at the
    start (`restored` = 1 when every saved residual was restored).
"""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ARGS = json.loads(sys.argv[1])
TASK = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

import tensorflow as tf  # noqa: E402

from keras_largebatch.distribute import MultiWorkerMirroredStrategy  # noqa: E402

strategy = MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=ARGS.get("timeout", 120)
    ),
    **ARGS.get("strategy", {}),
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_largebatch  # noqa: E402
from keras_largebatch.distribute import sparse  # noqa: E402
from keras_largebatch.distribute.config import ReduceConfig  # noqa: E402

SHAPES = [(300, 40), (40,), (40, 10), (10,)]


def gradients(task, step):
    """Gradient-like values of 1e-6...1e-2, distinct magnitudes."""
    rng = np.random.RandomState(1000 * step + task)
    return [
        (rng.normal(size=s) * 10.0 ** rng.uniform(-6, -2, size=s))
        .astype("float32")
        for s in SHAPES
    ]


def reduce_mode(run, out):
    checkpoint = tf.train.Checkpoint(residuals=strategy.topk_residuals)
    if run.get("restore"):
        checkpoint.restore(f"{run['restore']}_{TASK}").expect_partial()

    @tf.function
    def step(grads):
        def replica(grads):
            ctx = tf.distribute.get_replica_context()
            # On the replica's device, as gradients are.
            return ctx.all_reduce("sum", [tf.identity(g) for g in grads])

        return strategy.run(replica, args=(grads,))

    first = run.get("first_step", 0)
    for s in range(first, first + run["steps"]):
        g = gradients(TASK, s)
        y = step([tf.constant(x) for x in g])
        out[f"g{s}"] = np.concatenate([x.ravel() for x in g])
        out[f"y{s}"] = np.concatenate([t.numpy().ravel() for t in y])
        residuals = {v.name.split(":")[0]: v.numpy()
                     for v in strategy.topk_residuals.variables}
        for i in range(len(SHAPES)):
            name = [n for n in residuals if n.endswith(f"_{i}")]
            if name:
                out[f"r{s}_{i}"] = residuals[name[0]]
    out["num_residuals"] = len(strategy.topk_residuals.variables)
    if run.get("save"):
        checkpoint.write(f"{run['save']}_{TASK}")


def train_mode(run, out):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(4096, 32)).astype("float32")
    teacher = [rng.normal(size=(32, 32)), rng.normal(size=(32, 8))]
    y = (np.tanh(x @ teacher[0]) @ teacher[1]).argmax(axis=1).astype("int32")
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(8),
        ])
        if run.get("optimizer", "sgd") == "sgd":
            optimizer = keras.optimizers.SGD(
                run["learning_rate"], momentum=run.get("momentum", 0.0)
            )
        else:
            optimizer = keras_largebatch.LARSMixed(
                learning_rate=run["learning_rate"], momentum=0.9,
                eta=run.get("eta", 0.01),
            )
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    callbacks = []
    if run.get("residual_dir"):
        callbacks.append(sparse.residual_checkpoint_callback(
            strategy, run["residual_dir"]
        ))
    history = model.fit(x, y, batch_size=run["batch_size"],
                        epochs=run["epochs"], shuffle=False, verbose=0,
                        callbacks=callbacks)
    if callbacks and callbacks[0].status is not None:
        # Every residual saved was restored into one created here.
        callbacks[0].status.assert_consumed()
        out["restored"] = 1
    out["residuals"] = np.concatenate(
        [v.numpy().ravel() for v in strategy.topk_residuals.variables]
        or [np.zeros(0)]
    )
    out["loss"] = np.array(history.history["loss"])
    out["final_loss"] = model.evaluate(x, y, batch_size=1024, verbose=0)
    for i, w in enumerate(model.get_weights()):
        out[f"w{i}"] = w


def start(run):
    """This run's settings, with fresh residuals, on the cross-device ops.

    The ops' `config` setter keeps the residuals (those of the previous
    run); `_set_config` takes new ones. Settings are read when a function
    is traced: each run traces its own."""
    config = ReduceConfig(**dict(ARGS.get("strategy", {}),
                                 **run.get("strategy", {})))
    ops = strategy.cross_device_ops
    # The nodes were grouped by the constructor's `workers_per_node`.
    assert config.workers_per_node == ops.config.workers_per_node, run
    ops._set_config(config, sparse.Residuals())
    assert not strategy.topk_residuals.variables


def main():
    for run in ARGS["runs"]:
        start(run)
        out = {}
        {"reduce": reduce_mode, "train": train_mode}[run["mode"]](run, out)
        np.savez(f"{ARGS['out']}_{run['name']}.npz", **out)


if __name__ == "__main__":
    main()
