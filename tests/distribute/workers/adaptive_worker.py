"""One task of a localhost job growing the batch with `AdaptiveBatch`.

Usage: `python adaptive_worker.py '<json>'`, with `TF_CONFIG` set for a
worker (absent: one process, no strategy). JSON keys: `out` (a JSON file:
per policy, the logs per epoch, the k in effect at each micro-batch and
the noise-scale source), `policies` (of `"noise_scale"`, `"schedule"`),
`batch_size` (global, per micro-batch), `epochs`, `timeout` (collective,
seconds). The problem is the regression of `tests/regression_problem.py`:
y = x.w* + noise, x ~ N(0, I_64), weights held still (Keras SGD at rate 0,
two micro-batches per update to start), B_simple = 129.
"""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ARGS = json.loads(sys.argv[1])

import tensorflow as tf  # noqa: E402

from keras_largebatch.distribute import MultiWorkerMirroredStrategy  # noqa: E402

strategy = None
if "TF_CONFIG" in os.environ:
    strategy = MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=ARGS.get("timeout", 60)))

import contextlib  # noqa: E402

import keras  # noqa: E402

import keras_largebatch as klb  # noqa: E402
from keras_largebatch import noise_scale  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


class Trajectory(keras.callbacks.Callback):
    """The k in effect at each micro-batch, as the optimizer runs it."""

    def __init__(self):
        super().__init__()
        self.ks = []

    def on_train_batch_begin(self, batch, logs=None):
        self.ks.append(noise_scale.accumulating_optimizer(
            self.model.optimizer).gradient_accumulation_steps)


def run(policy, x, y, w):
    batch = ARGS["batch_size"]
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = linear_model(w)
        model.compile(keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
                      "mse")
    if policy == "schedule":
        adaptive = klb.AdaptiveBatch(batch, policy="schedule",
                                     schedule=[(1, 4 * batch), (2, 8 * batch)])
    else:
        # B_simple itself (c = 1) from the compiled batch: closed form.
        adaptive = klb.AdaptiveBatch(batch, max_batch_size=64 * batch,
                                     beta=0.98, c=1.0, start_multiple=1)
    trajectory = Trajectory()
    history = model.fit(
        x.astype("float32"), y.astype("float32"), batch_size=batch,
        epochs=ARGS.get("epochs", 3), shuffle=True, verbose=0,
        callbacks=[adaptive, trajectory])
    logs = {name: [float(v) for v in history.history[name]]
            for name in ("global_batch_size", "updates",
                         "gradient_noise_scale")}
    source = noise_scale.check_measurable(adaptive.state.inner_optimizer,
                                          model.distribute_strategy)
    return dict(logs, ks=trajectory.ks, source=source)


def main():
    # 127 micro-batches of 32 an epoch.
    x, y, w = regression(d=64, n=4064, sigma=1.0)
    results = {p: run(p, x, y, w) for p in ARGS["policies"]}
    with open(ARGS["out"], "w") as f:
        json.dump(results, f)


main()
