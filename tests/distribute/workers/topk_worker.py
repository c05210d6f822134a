"""One task of a localhost job under `compression="topk"`, driven by
`test_distribute_topk.py`.

Usage: `python topk_worker.py '<json>'`, with `TF_CONFIG` set. JSON keys:

- `out`: `.npz` written at the end;
- `strategy`: keyword arguments of `MultiWorkerMirroredStrategy`;
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
    **ARGS["strategy"],
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_largebatch  # noqa: E402

SHAPES = [(300, 40), (40,), (40, 10), (10,)]


def gradients(task, step):
    """Gradient-like values of 1e-6...1e-2, distinct magnitudes."""
    rng = np.random.RandomState(1000 * step + task)
    return [
        (rng.normal(size=s) * 10.0 ** rng.uniform(-6, -2, size=s))
        .astype("float32")
        for s in SHAPES
    ]


def reduce_mode(out):
    checkpoint = tf.train.Checkpoint(residuals=strategy.topk_residuals)
    if ARGS.get("restore"):
        checkpoint.restore(f"{ARGS['restore']}_{TASK}").expect_partial()

    @tf.function
    def step(grads):
        def replica(grads):
            ctx = tf.distribute.get_replica_context()
            # On the replica's device, as gradients are.
            return ctx.all_reduce("sum", [tf.identity(g) for g in grads])

        return strategy.run(replica, args=(grads,))

    first = ARGS.get("first_step", 0)
    for s in range(first, first + ARGS["steps"]):
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
    if ARGS.get("save"):
        checkpoint.write(f"{ARGS['save']}_{TASK}")


def train_mode(out):
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
        if ARGS.get("optimizer", "sgd") == "sgd":
            optimizer = keras.optimizers.SGD(
                ARGS["learning_rate"], momentum=ARGS.get("momentum", 0.0)
            )
        else:
            optimizer = keras_largebatch.LARSMixed(
                learning_rate=ARGS["learning_rate"], momentum=0.9,
                eta=ARGS.get("eta", 0.01),
            )
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    callbacks = []
    if ARGS.get("residual_dir"):
        from keras_largebatch.distribute import sparse

        callbacks.append(sparse.residual_checkpoint_callback(
            strategy, ARGS["residual_dir"]
        ))
    history = model.fit(x, y, batch_size=ARGS["batch_size"],
                        epochs=ARGS["epochs"], shuffle=False, verbose=0,
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


def main():
    out = {}
    {"reduce": reduce_mode, "train": train_mode}[ARGS["mode"]](out)
    np.savez(ARGS["out"], **out)


if __name__ == "__main__":
    main()
