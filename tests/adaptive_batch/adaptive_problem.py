"""The adaptive-batch tests' shared problems: `fit` with callbacks, the
optimizers they compile, and a float64 SGD reference over micro-batches."""

import keras

import keras_largebatch as klb
from keras_largebatch.adaptive_batch import policies
from regression_problem import linear_model
from regression_problem import regression


B_SIMPLE = 129.0  # ((d + 1)|e|^2 + d sigma^2) / |e|^2, d = 64, |e| = sigma = 1


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
    # At 1e-9 the weights stay still to float32 (LARS needs a rate > 0).
    "lars": lambda: klb.LARS(1e-9, gradient_accumulation_steps=2),
    "lars_mixed": lambda: klb.LARSMixed(1e-9, gradient_accumulation_steps=2),
}


def fit(model, x, y, callbacks, epochs, batch, **kwargs):
    if not isinstance(callbacks, list):
        callbacks = [callbacks]
    return model.fit(x.astype("float32"), y.astype("float32"),
                     batch_size=batch, epochs=epochs, verbose=0,
                     callbacks=callbacks, **kwargs).history


# The closed-form checks each registered policy must pass: one that reads
# B_simple grows to it; one that takes a schedule follows it.
NOISE_POLICIES = [n for n, p in policies.POLICIES.items()
                  if p.reads_noise_scale]
SCHEDULE_POLICIES = [n for n, p in policies.POLICIES.items()
                     if p.takes_schedule]


def reference(x, y, w, batch, rate, ks):
    """float64 SGD of L = mean((x.w - y)^2) over micro-batches in order; the
    micro-batch with counter i is accumulated under k = ks(i) and an update
    (at rate(i)) ends when (i + 1) % k == 0."""
    w = w.astype("float64").copy()
    acc, updates = 0.0, 0
    for i in range(len(x) // batch):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        acc = acc + 2.0 * xb.T @ (xb @ w - yb) / batch
        k = ks(i)
        if (i + 1) % k == 0:
            w -= rate(i) * acc / k
            acc, updates = 0.0, updates + 1
    return w, updates


def decaying_sgd_problem():
    """48 examples of a 4-d regression (6 micro-batches of 8 an epoch) and a
    linear model compiled with SGD at 0.05 * 0.5**(i / 6), k0 = 2."""
    x, y, w = regression(d=4, n=48, sigma=0.5)
    schedule = keras.optimizers.schedules.ExponentialDecay(
        0.05, decay_steps=6, decay_rate=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(schedule, gradient_accumulation_steps=2),
                  "mse")
    return x, y, w, model
