"""One task of a localhost job measuring the gradient noise scale.

Usage: `python gns_worker.py '<json>'`, with `TF_CONFIG` set for a worker
(absent: one process, no strategy). JSON keys: `out` (a JSON file of the
callback's logs per epoch and its source), `optimizer` (`"sgd"` or
`"lars_mixed"`), `accumulation` (gradient accumulation steps, default
none), `batch_size` (global, per step), `epochs`, `timeout` (collective,
seconds); `optimizers` (a list) measures each in turn in this one process
(its strategy made once), each into `out` formatted with its name. The problem is the regression of `tests/regression_problem.py`:
y = x.w* + noise, x ~ N(0, I_64), weights held still, B_simple = 129.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


def measure(name, out):
    x, y, w = regression(d=64, n=16384, sigma=1.0)
    keras.utils.set_random_seed(1)
    k = ARGS.get("accumulation")
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = linear_model(w)
        if name == "sgd":
            optimizer = keras.optimizers.SGD(
                0.0, gradient_accumulation_steps=k)
        else:
            optimizer = klb.LARSMixed(1e-9, gradient_accumulation_steps=k)
        model.compile(optimizer, "mse")
    gns = klb.GradientNoiseScale(ARGS["batch_size"], beta=0.995, interval=1)
    history = model.fit(
        x.astype("float32"), y.astype("float32"),
        batch_size=ARGS["batch_size"], epochs=ARGS.get("epochs", 2),
        shuffle=True, verbose=0, callbacks=[gns])
    logs = {name: [float(v) for v in history.history[name]]
            for name in ("gradient_noise_scale", "gns_grad_sq_norm",
                         "gns_trace_cov")}
    with open(out, "w") as f:
        json.dump(dict(logs, source=gns.source), f)


for name in ARGS.get("optimizers", [ARGS.get("optimizer")]):
    measure(name, ARGS["out"].format(optimizer=name))
