"""The batch in effect: a switch waits for a micro-batch the new k divides,
keeps the optimizer's state, is optimizer state saved and restored (a
killed run resumes bit for bit), and the rate is scaled by a saved
schedule; on the backend of the run."""

import os
import sys

import keras
import numpy as np
import pytest

import keras_largebatch as klb

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]
from adaptive_problem import SCHEDULE_POLICIES  # noqa: E402
from adaptive_problem import decaying_sgd_problem  # noqa: E402
from adaptive_problem import fit  # noqa: E402
from adaptive_problem import reference  # noqa: E402
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


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


@pytest.mark.parametrize("policy", SCHEDULE_POLICIES)
def test_switch_waits_for_a_micro_batch_index_that_new_k_divides(policy):
    # 6 micro-batches an epoch: at the start of epoch 1 the counter is 6, so
    # k = 4 starts at 8, after one more update of k = 2 (6, 7).
    x, y, w, model = decaying_sgd_problem()
    callback = klb.AdaptiveBatch(8, policy=policy, schedule=[(1, 32)],
                                 learning_rate_rule="unchanged")
    history = fit(model, x, y, callback, epochs=3, batch=8, shuffle=False)
    assert history["global_batch_size"] == [16, 32, 32]
    expected, updates = reference(
        np.tile(x, (3, 1)), np.tile(y, (3, 1)), w, 8,
        lambda i: 0.05 * 0.5 ** (i / 6), lambda i: 2 if i < 8 else 4)
    assert history["updates"] == [3, 5, updates]
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)
    # The rate follows the micro-batch count (examples), not updates.
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        0.05 * 0.5 ** (18 / 6), rtol=1e-6)


def test_a_ramp_of_any_multiples_switches_where_both_ks_end_an_update():
    # A linear ramp's k = 4 -> 6: at epoch 3's start the counter is 18, inside
    # an update of k = 4 (16-19); k = 6 starts at 24, the first index both
    # divide (lcm 12), so no gradient is dropped or mis-averaged.
    x, y, w, model = decaying_sgd_problem()
    callback = klb.AdaptiveBatch(8, policy="schedule",
                                 schedule=[(1, 32), (3, 48)],
                                 learning_rate_rule="unchanged")
    history = fit(model, x, y, callback, epochs=5, batch=8, shuffle=False)
    assert history["global_batch_size"] == [16, 32, 32, 32, 48]
    expected, updates = reference(
        np.tile(x, (5, 1)), np.tile(y, (5, 1)), w, 8,
        lambda i: 0.05 * 0.5 ** (i / 6),
        lambda i: 2 if i < 8 else 4 if i < 24 else 6)
    assert history["updates"][-1] == updates
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)


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
