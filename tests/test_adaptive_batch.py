"""AdaptiveBatch: the batch follows B_simple on a closed-form problem, a
change keeps the optimizer's state, the switch point and the rate follow
micro-batches (examples), and the arguments; on the backend of the run."""

import ast
import inspect
import math
import os
import pathlib
import sys

import keras
import numpy as np
import pytest

import keras_largebatch as klb
from keras_largebatch import noise_scale
from keras_largebatch.adaptive_batch import policies
from keras_largebatch.adaptive_batch import rules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


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


def test_every_registered_policy_has_a_closed_form_check():
    assert set(NOISE_POLICIES) | set(SCHEDULE_POLICIES) == set(
        policies.POLICIES)


@pytest.mark.parametrize("policy", NOISE_POLICIES)
@pytest.mark.parametrize("name, c", [(name, 1.0) for name in sorted(OPTIMIZERS)]
                         + [("sgd", 4.0)])
def test_noise_scale_policy_grows_to_b_simple_and_stops_there(name, c,
                                                              policy):
    x, y, w = regression(d=64, n=8192, sigma=1.0)
    model = linear_model(w)
    model.compile(OPTIMIZERS[name](), "mse")
    callback = klb.AdaptiveBatch(16, max_batch_size=2048, beta=0.98,
                                 policy=policy, c=c, start_multiple=1)
    history = fit(model, x, y, callback, epochs=3, batch=16, shuffle=True)
    batches = history["global_batch_size"]
    # Starts at 16 * 2, far below c * B_simple; one epoch measures it.
    assert batches[0] == 32
    assert c * B_SIMPLE / 2 <= batches[1] <= 2 * c * B_SIMPLE
    assert batches[2] == batches[1]
    np.testing.assert_allclose(history["gradient_noise_scale"][-1], B_SIMPLE,
                               rtol=0.25)


def _snapshot(model):
    inner = model.optimizer.inner_optimizer
    return ([keras.ops.convert_to_numpy(v) for v in model.weights],
            [keras.ops.convert_to_numpy(v) for v in inner.variables])


class _Snapshot(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.state = _snapshot(self.model)


def test_batch_change_keeps_optimizer_state_and_loss_scale():
    x, y, w = regression(d=8, n=256, sigma=0.5)

    def optimizer(k):
        # A loss scale that grows every 3 finite steps, and momentum.
        return klb.LARSMixed(0.5, momentum=0.9, eta=0.01,
                             dynamic_growth_steps=3,
                             gradient_accumulation_steps=k)

    grown = linear_model(w)
    grown.compile(optimizer(2), "mse")
    snapshot = _Snapshot()
    grown.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[klb.AdaptiveBatch(16, schedule=[(1, 64)],
                                           policy="schedule",
                                           learning_rate_rule="unchanged"),
                         snapshot])
    assert grown.optimizer.inner_optimizer.inner_optimizer \
        .gradient_accumulation_steps == 4
    # The same state after epoch 0, in an optimizer compiled with k = 4.
    weights, variables = snapshot.state
    started = linear_model(w)
    started.compile(optimizer(4), "mse")
    started.optimizer.build(started.trainable_variables)
    started.set_weights(weights)
    for v, value in zip(started.optimizer.variables, variables):
        v.assign(value)
    started.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    end = _snapshot(grown)
    scale = grown.optimizer.inner_optimizer.dynamic_scale
    assert float(keras.ops.convert_to_numpy(scale)) > 2.0 ** 15  # it grew
    for a, b in zip(end[0] + end[1], started.weights + [
            keras.ops.convert_to_numpy(v)
            for v in started.optimizer.variables]):
        np.testing.assert_allclose(a, keras.ops.convert_to_numpy(b),
                                   rtol=1e-6, atol=1e-7)


def _reference(x, y, w, batch, rate, ks):
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


def _decaying_sgd_problem():
    """48 examples of a 4-d regression (6 micro-batches of 8 an epoch) and a
    linear model compiled with SGD at 0.05 * 0.5**(i / 6), k0 = 2."""
    x, y, w = regression(d=4, n=48, sigma=0.5)
    schedule = keras.optimizers.schedules.ExponentialDecay(
        0.05, decay_steps=6, decay_rate=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(schedule, gradient_accumulation_steps=2),
                  "mse")
    return x, y, w, model


@pytest.mark.parametrize("policy", SCHEDULE_POLICIES)
def test_switch_waits_for_a_micro_batch_index_that_new_k_divides(policy):
    # 6 micro-batches an epoch: at the start of epoch 1 the counter is 6, so
    # k = 4 starts at 8, after one more update of k = 2 (6, 7).
    x, y, w, model = _decaying_sgd_problem()
    callback = klb.AdaptiveBatch(8, policy=policy, schedule=[(1, 32)],
                                 learning_rate_rule="unchanged")
    history = fit(model, x, y, callback, epochs=3, batch=8, shuffle=False)
    assert history["global_batch_size"] == [16, 32, 32]
    expected, updates = _reference(
        np.tile(x, (3, 1)), np.tile(y, (3, 1)), w, 8,
        lambda i: 0.05 * 0.5 ** (i / 6), lambda i: 2 if i < 8 else 4)
    assert history["updates"] == [3, 5, updates]
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)
    # The rate follows the micro-batch count (examples), not updates.
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        0.05 * 0.5 ** (18 / 6), rtol=1e-6)


@pytest.mark.parametrize("policy", NOISE_POLICIES)
def test_anneal_brings_the_batch_down_after_the_update_in_progress(policy):
    # 6 micro-batches an epoch; k = 4 from the first (start 2 x k0, and the
    # cap 32 = 4 x 8). Epoch 3 of 4 is the last quarter: capped at 1 x k0.
    # Its first micro-batch is 18, inside an update of 4 (16-19): k = 2
    # starts at 20, and the rate (linear in k) halves there.
    x, y, w, model = _decaying_sgd_problem()
    callback = klb.AdaptiveBatch(8, max_batch_size=32, policy=policy,
                                 start_multiple=2, learning_rate_rule="linear",
                                 anneal_fraction=0.25, anneal_multiple=1)
    history = fit(model, x, y, callback, epochs=4, batch=8, shuffle=False)
    assert history["global_batch_size"] == [32, 32, 32, 16]

    def k(i):
        return 4 if i < 20 else 2

    expected, updates = _reference(
        np.tile(x, (4, 1)), np.tile(y, (4, 1)), w, 8,
        lambda i: 0.05 * 0.5 ** (i / 6) * k(i) / 2, k)
    assert history["updates"] == [1, 3, 4, updates]
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)
    factor = callback.state.learning_rate_factor
    assert float(keras.ops.convert_to_numpy(factor)) == 1.0


def test_anneal_takes_the_last_share_of_the_epochs_and_never_grows_past():
    x, y, w = regression(d=64, n=8192, sigma=1.0)
    model = linear_model(w)
    model.compile(OPTIMIZERS["sgd"](), "mse")
    callback = klb.AdaptiveBatch(16, max_batch_size=2048, beta=0.98, c=1.0,
                                 start_multiple=1, anneal_fraction=0.4,
                                 anneal_multiple=2)
    history = fit(model, x, y, callback, epochs=5, batch=16, shuffle=True)
    batches = history["global_batch_size"]
    # 0.4 * 5 = 2 epochs at most 2 x 32; before them, B_simple.
    assert batches[0] == 32
    assert B_SIMPLE / 2 <= batches[1] == batches[2] <= 2 * B_SIMPLE
    assert batches[3:] == [64, 64]
    # 512 micro-batches of 16 an epoch: 128 updates of 64 in each of the
    # last two.
    assert np.diff(history["updates"])[-2:].tolist() == [128, 128]


def _adascale(scale, ratio):
    if not (math.isfinite(ratio) and ratio > 0):
        return scale
    return (ratio + 1) / (ratio / scale + 1)


# Each registered rule's factor on SGD at S = k / k0, ratio = B_simple / B0,
# written out independently of keras_largebatch.adaptive_batch.rules.
RULE_FACTORS = {
    "unchanged": lambda scale, ratio: 1.0,
    "linear": lambda scale, ratio: scale,
    "sqrt": lambda scale, ratio: math.sqrt(scale),
    "auto": lambda scale, ratio: scale,  # linear for SGD
    "adascale": _adascale,
}


def test_every_registered_rule_has_a_closed_form_here():
    assert set(RULE_FACTORS) == set(rules.RULES)


@pytest.mark.parametrize("rule", list(rules.RULES))
@pytest.mark.parametrize("rate", ["float", "schedule"])
def test_learning_rate_rule_scales_the_compiled_rate(rule, rate):
    x, y, w = regression(d=4, n=64, sigma=0.5)
    base = 0.01 if rate == "float" else \
        keras.optimizers.schedules.ExponentialDecay(0.01, 8, 0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(base, gradient_accumulation_steps=2),
                  "mse")
    history = fit(model, x, y, klb.AdaptiveBatch(
        8, policy="schedule", schedule=[(1, 64)], learning_rate_rule=rule),
        epochs=2, batch=8, shuffle=False)
    # S = 64 / 16; the change is at epoch 1's start, after epoch 0's logs.
    factor = RULE_FACTORS[rule](4.0, history["gradient_noise_scale"][0] / 16)
    expected = 0.01 if rate == "float" else 0.01 * 0.5 ** (16 / 8)
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        expected * factor, rtol=1e-5)


def test_adascale_gain_comes_from_the_statistics_at_the_change():
    x, y, w = regression(d=64, n=4096, sigma=1.0)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(1e-9, gradient_accumulation_steps=2),
                  "mse")
    history = fit(model, x, y, klb.AdaptiveBatch(
        16, policy="schedule", schedule=[(1, 128)],
        learning_rate_rule="adascale"), epochs=2, batch=16, shuffle=True)
    ratio = history["gradient_noise_scale"][0] / 32  # B_simple / B0
    gain = (ratio + 1) / (ratio / 4 + 1)  # S = 128 / 32
    assert 1 < gain < 4
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        1e-9 * gain, rtol=1e-5)


def _save_by_position(self, store):
    """`NoiseScaleOptimizer.save_own_variables` before the keyed store."""
    for i, variable in enumerate(self._variables):
        store[str(i)] = keras.ops.convert_to_numpy(variable)


@pytest.mark.parametrize("layout", ["named", "by_position"])
def test_saved_state_resumes_at_the_batch_it_had(tmp_path, monkeypatch,
                                                 layout):
    # "by_position": a checkpoint of keras_largebatch before the keyed store.
    x, y, w = regression(d=4, n=64, sigma=0.5)

    def compiled():
        model = linear_model(w)
        model.compile(klb.NoiseScaleOptimizer(
            keras.optimizers.SGD(0.01, gradient_accumulation_steps=2)), "mse")
        model.optimizer.build(model.trainable_variables)
        return model

    model = compiled()
    fit(model, x, y, klb.AdaptiveBatch(
        8, policy="schedule", schedule=[(1, 32)], learning_rate_rule="linear"),
        epochs=2, batch=8, shuffle=False)
    path = str(tmp_path / "run.weights.h5")
    with monkeypatch.context() as patch:
        if layout == "by_position":
            patch.setattr(klb.NoiseScaleOptimizer, "save_own_variables",
                          _save_by_position)
        model.save_weights(path)
    restored = compiled()
    restored.load_weights(path)
    assert restored.optimizer.result(8) == model.optimizer.result(8)
    # A schedule that alone would keep k0 this epoch: the saved k wins.
    history = fit(restored, x, y, klb.AdaptiveBatch(
        8, policy="schedule", schedule=[(9, 32)], learning_rate_rule="linear"),
        epochs=3, batch=8, shuffle=False, initial_epoch=2)
    assert history["global_batch_size"] == [32]
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(restored.optimizer.learning_rate)),
        0.02, rtol=1e-6)


def test_the_batch_decision_is_optimizer_state_the_callback_holds_none():
    # 6 micro-batches an epoch: k = 4 waits two micro-batches for counter 8.
    x, y, w = regression(d=4, n=48, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.01, gradient_accumulation_steps=2),
                  "mse")
    adaptive = klb.AdaptiveBatch(8, policy="schedule", schedule=[(1, 32)])
    plain = keras.callbacks.Callback()
    before = set(vars(adaptive)), set(vars(plain))
    fit(model, x, y, [adaptive, plain], epochs=2, batch=8, shuffle=False)
    added = set(vars(adaptive)) - before[0]
    # Keras' own attributes, and when to read the counter next.
    assert added - (set(vars(plain)) - before[1]) <= {"_check_at"}
    state = model.optimizer
    assert adaptive.state is state
    assert int(keras.ops.convert_to_numpy(state.accumulation_steps)) == 4
    assert state.pending_accumulation_steps is None


def test_logs_carry_the_batch_and_the_noise_scale_each_epoch():
    x, y, w = regression(d=8, n=256, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
                  "mse")
    history = fit(model, x, y, klb.AdaptiveBatch(16, max_batch_size=64,
                                                 start_multiple=1),
                  epochs=2, batch=16, shuffle=False)
    for name in ("global_batch_size", "updates", "gradient_noise_scale"):
        assert len(history[name]) == 2
    assert history["global_batch_size"][0] == 32


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        ({"batch_size": 0, "max_batch_size": 64}, "batch_size=0"),
        ({"batch_size": 16, "max_batch_size": 40}, "max_batch_size=40"),
        ({"batch_size": 16, "start_multiple": 3}, "start_multiple=3"),
        ({"batch_size": 16, "start_multiple": 0}, "start_multiple=0"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(1, 32)],
          "start_multiple": 2}, "start_multiple=2"),
        ({"batch_size": 16, "max_batch_size": 64, "policy": "linear"},
         "policy='linear'"),
        ({"batch_size": 16, "max_batch_size": 64, "c": 0.0}, "c=0.0"),
        ({"batch_size": 16, "max_batch_size": 64,
          "learning_rate_rule": "cubic"}, "learning_rate_rule='cubic'"),
        ({"batch_size": 16, "max_batch_size": 64, "schedule": [(1, 32)]},
         "schedule=[(1, 32)]"),
        ({"batch_size": 16, "policy": "schedule"}, "schedule=None"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(2, 64),
                                                               (1, 128)]},
         "schedule=[(2, 64), (1, 128)]"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(1, 24)]},
         "schedule=[(1, 24)]"),
        ({"batch_size": 16, "policy": "schedule", "max_batch_size": 32,
          "schedule": [(1, 64)]}, "schedule=[(1, 64)]"),
        ({"batch_size": 16, "max_batch_size": 64, "beta": 1.0}, "beta=1.0"),
        ({"batch_size": 16, "max_batch_size": 64, "interval": 0},
         "interval=0"),
        ({"batch_size": 16, "anneal_fraction": 1.0}, "anneal_fraction=1.0"),
        ({"batch_size": 16, "anneal_fraction": -0.25},
         "anneal_fraction=-0.25"),
        ({"batch_size": 16, "anneal_multiple": 3}, "anneal_multiple=3"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(1, 32)],
          "anneal_fraction": 0.25}, "anneal_fraction=0.25"),
    ],
)
def test_bad_argument_is_named_with_its_value(kwargs, shown):
    argument = shown.split("=")[0]
    with pytest.raises(ValueError, match=f"`{argument}`") as info:
        klb.AdaptiveBatch(**kwargs)
    assert f"Received: {shown}" in str(info.value)


@pytest.mark.parametrize(
    "k, kwargs, shown",
    [
        (None, {"max_batch_size": 64}, "gradient_accumulation_steps=None"),
        (4, {"max_batch_size": 16}, "max_batch_size=16"),
        (2, {"policy": "schedule", "schedule": [(1, 48)]},
         "schedule=[(1, 48)]"),
    ],
)
def test_fit_refuses_what_the_compiled_optimizer_cannot_grow(k, kwargs,
                                                             shown):
    x, y, w = regression(d=4, n=64, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.01, gradient_accumulation_steps=k),
                  "mse")
    with pytest.raises(ValueError) as info:
        fit(model, x, y, klb.AdaptiveBatch(8, **kwargs), epochs=1, batch=8)
    assert f"Received: {shown}" in str(info.value)


def test_get_config_covers_every_argument():
    callback = klb.AdaptiveBatch(16, policy="schedule", schedule=[(2, 64)],
                                 learning_rate_rule="sqrt", c=2.0)
    config = callback.get_config()
    signature = inspect.signature(klb.AdaptiveBatch.__init__)
    assert set(config) == set(signature.parameters) - {"self"}
    assert klb.AdaptiveBatch(**config).get_config() == config


@pytest.mark.parametrize("make, rule", [
    (lambda: keras.optimizers.SGD(0.01, gradient_accumulation_steps=2),
     "linear"),
    (lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.01, gradient_accumulation_steps=2)), "linear"),
    (lambda: klb.LARS(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: klb.LAMB(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: klb.LARSMixed(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: klb.LAMBMixed(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2),
     "unchanged"),
])
def test_auto_rule_is_linear_for_sgd_and_unchanged_for_normalised_steps(
        make, rule):
    x, y, w = regression(d=4, n=64, sigma=0.5)
    model = linear_model(w)
    model.compile(make(), "mse")
    callback = klb.AdaptiveBatch(8, policy="schedule", schedule=[(1, 64)])
    fit(model, x, y, callback, epochs=2, batch=8, shuffle=False)
    assert callback.resolved_rule() == rule
    factor = float(keras.ops.convert_to_numpy(
        callback.state.learning_rate_factor))
    assert factor == (4.0 if rule == "linear" else 1.0)


FAMILIES = {
    # Keras' SGD, alone and loss-scaled: the rate linear in the batch.
    "sgd": (lambda: keras.optimizers.SGD(1e-9, gradient_accumulation_steps=2),
            "linear"),
    "lso_sgd": (lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(1e-9, gradient_accumulation_steps=2)),
        "linear"),
    # Normalised steps: the rate unchanged.
    "lars": (lambda: klb.LARS(1e-9, gradient_accumulation_steps=2),
             "unchanged"),
    "lars_mixed": (lambda: klb.LARSMixed(1e-9, gradient_accumulation_steps=2),
                   "unchanged"),
    "lamb": (lambda: klb.LAMB(1e-9, gradient_accumulation_steps=2),
             "unchanged"),
    "lamb_mixed": (lambda: klb.LAMBMixed(1e-9, gradient_accumulation_steps=2),
                   "unchanged"),
    "adam": (lambda: keras.optimizers.Adam(1e-9,
                                           gradient_accumulation_steps=2),
             "unchanged"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_defaults_start_at_4x_follow_4_b_simple_up_to_8x(family):
    make, rule = FAMILIES[family]
    x, y, w = regression(d=64, n=2048, sigma=1.0)
    model = linear_model(w)
    model.compile(make(), "mse")
    callback = klb.AdaptiveBatch(16)  # only the micro-batch: the defaults
    history = fit(model, x, y, callback, epochs=2, batch=16, shuffle=True)
    # Compiled at 16 * 2 = 32: 128 from the first update, then 4 x B_simple
    # (~516) capped at 8 x 32 = 256; the rate x 4 then x 8 (linear) or x 1.
    assert history["global_batch_size"] == [128, 256]
    assert callback.max_batch_size == 256
    assert callback.resolved_rule() == rule
    factor = float(keras.ops.convert_to_numpy(
        callback.state.learning_rate_factor))
    assert factor == (8.0 if rule == "linear" else 1.0)
    # 128 micro-batches an epoch: 16 updates of 8, then 8 of 16.
    assert history["updates"] == [16, 24]


def test_exported_and_registered_under_package_name():
    assert (keras.saving.get_registered_name(klb.AdaptiveBatch)
            == "keras_largebatch>AdaptiveBatch")
    assert math.isclose(klb.AdaptiveBatch(8, 64).c, 4.0)


def test_scaled_rate_lives_with_the_schedules_and_round_trips():
    from keras_largebatch import adaptive_batch
    from keras_largebatch import schedules

    assert adaptive_batch.ScaledLearningRate is schedules.ScaledLearningRate
    rate = schedules.ScaledLearningRate(
        keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5), 2.0)
    config = keras.saving.serialize_keras_object(rate)
    assert config["registered_name"] == "keras_largebatch>ScaledLearningRate"
    loaded = keras.saving.deserialize_keras_object(config)
    np.testing.assert_allclose(float(loaded(4)), 0.1, rtol=1e-6)


def _listed_names(tree):
    """The string sets of every tuple, list, set and dict literal in
    `tree`."""
    for node in ast.walk(tree):
        items = (node.keys if isinstance(node, ast.Dict) else node.elts
                 if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else ())
        yield {i.value for i in items
               if isinstance(i, ast.Constant) and isinstance(i.value, str)}


def test_policies_and_rules_are_listed_only_in_their_registries():
    # A second list of the names (the command's flag choices, a check) is
    # one a new entry would miss: everything reads POLICIES and RULES. A
    # copy holds all the names, or all but one once an entry is added
    # (`--lr_scaling`'s 'auto', 'linear', 'sqrt' are another concept).
    package = pathlib.Path(klb.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for names in _listed_names(ast.parse(path.read_text())):
            for registry in (policies.POLICIES, rules.RULES):
                if len(names & set(registry)) >= max(2, len(registry) - 1):
                    found.append((str(path.relative_to(package)),
                                  sorted(names)))
    assert not found


class _Kill(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("killed")


# 6 micro-batches an epoch: each change waits for its micro-batch.
KILLED = {
    # A schedule (16, 32, 64), killed at epoch 1's end.
    "schedule": (dict(policy="schedule", schedule=[(1, 32), (2, 64)],
                      learning_rate_rule="sqrt"),
                 1, [16, 32, 64, 64]),
    # k = 8 (start 4 x k0 = the cap 64 / 8) until the last half: k = 4 from
    # micro-batch 16, when the update of 8 in progress at epoch 2's start
    # (12) ends. Killed at epoch 2's end, two micro-batches into an update.
    "annealing": (dict(max_batch_size=64, start_multiple=4,
                       learning_rate_rule="linear", anneal_fraction=0.5,
                       anneal_multiple=2),
                  2, [64, 64, 32, 32]),
}


@pytest.mark.parametrize("case", sorted(KILLED))
def test_killed_run_resumes_with_the_weights_of_an_uninterrupted_one(
        tmp_path, case):
    kwargs, kill_at, batches = KILLED[case]
    x, y, _ = regression(d=4, n=48, sigma=0.5)

    def run(*callbacks):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(
            keras.optimizers.schedules.ExponentialDecay(0.05, 6, 0.7),
            momentum=0.9, gradient_accumulation_steps=2), "mse")
        adaptive = klb.AdaptiveBatch(8, **kwargs)
        return model, fit(model, x, y, [adaptive, *callbacks], epochs=4,
                          batch=8, shuffle=False)

    reference, history = run()
    assert history["global_batch_size"] == batches
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="killed"):
        run(keras.callbacks.BackupAndRestore(backup), _Kill(kill_at))
    resumed, history = run(keras.callbacks.BackupAndRestore(backup))
    assert history["global_batch_size"] == batches[kill_at + 1:]
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)
