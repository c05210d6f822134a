"""Checkpoints of LARSMixed/LAMBMixed against other optimizers: whichever
writes and whichever reads, the optimizer state loads correctly or is
skipped with Keras' warning; it never lands on another optimizer's
variables. The model's weights load in every case."""

import warnings

import keras
import numpy as np
import pytest

import keras_largebatch as klb

LSO = keras.optimizers.LossScaleOptimizer
OTHERS = {
    "lso_sgd": lambda: LSO(keras.optimizers.SGD(0.1, momentum=0.9)),
    "lso_adam": lambda: LSO(keras.optimizers.Adam(1e-3)),
    "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "lars": lambda: klb.LARS(0.1),
}
OURS = {
    "lars_mixed": lambda: klb.LARSMixed(0.1, initial_scale=2.0**17),
    "lamb_mixed": lambda: klb.LAMBMixed(1e-3, initial_scale=2.0**17),
}
FORMATS = ["weights.h5", "keras"]
SKIPPED = "Skipping variable loading for optimizer"


def _model(optimizer):
    model = keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3),
    ])
    model.compile(optimizer=optimizer, loss="mse")
    return model


@pytest.fixture(scope="module", name="written")
def _written(tmp_path_factory):
    """`written(writer, fmt)`: the path of a checkpoint after two training
    steps, the model's weights and the optimizer's variables then."""
    folder = tmp_path_factory.mktemp("checkpoints")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6)).astype("float32")
    y = rng.normal(size=(16, 3)).astype("float32")
    cache = {}

    def written(writer, fmt):
        if (writer, fmt) not in cache:
            keras.utils.set_random_seed(1)
            model = _model({**OTHERS, **OURS}[writer]())
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
            path = str(folder / f"{writer}.{fmt}")
            if fmt == "keras":
                model.save(path)
            else:
                model.save_weights(path)
            cache[writer, fmt] = (path, _values(model.weights),
                                  _values(model.optimizer.variables))
        return cache[writer, fmt]

    return written


def _values(variables):
    return [keras.ops.convert_to_numpy(v) for v in variables]


def _read(make_reader, built, path):
    keras.utils.set_random_seed(2)
    model = _model(make_reader())
    if built:
        model.optimizer.build(model.trainable_variables)
    before = _values(model.optimizer.variables)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(path)
    messages = [str(w.message) for w in caught]
    return model, before, messages


def _assert_state_skipped(model, before, messages, weights):
    assert any(SKIPPED in m for m in messages), messages
    after = _values(model.optimizer.variables)
    assert len(after) == len(before)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(weights, _values(model.weights)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("built", [True, False], ids=["built", "unbuilt"])
@pytest.mark.parametrize("other", sorted(OTHERS))
def test_another_optimizer_skips_a_lars_mixed_checkpoint(
        written, other, built, fmt):
    path, weights, _ = written("lars_mixed", fmt)
    model, before, messages = _read(OTHERS[other], built, path)
    _assert_state_skipped(model, before, messages, weights)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("built", [True, False], ids=["built", "unbuilt"])
@pytest.mark.parametrize("other", sorted(OTHERS))
def test_lars_mixed_skips_another_optimizers_checkpoint(
        written, other, built, fmt):
    path, weights, _ = written(other, fmt)
    model, before, messages = _read(OURS["lars_mixed"], built, path)
    _assert_state_skipped(model, before, messages, weights)


@pytest.mark.parametrize("direction", ["written", "read"])
@pytest.mark.parametrize("other", ["lso_adam", "lars"])
def test_lamb_mixed_checkpoints_are_never_misread_either(
        written, other, direction):
    writer, reader = ("lamb_mixed", other)
    if direction == "read":
        writer, reader = reader, writer
    path, weights, _ = written(writer, "weights.h5")
    model, before, messages = _read({**OTHERS, **OURS}[reader], False, path)
    _assert_state_skipped(model, before, messages, weights)


@pytest.mark.parametrize("fmt", FORMATS)
def test_lars_and_lamb_mixed_skip_each_other(written, fmt):
    path, weights, _ = written("lamb_mixed", fmt)
    model, before, messages = _read(OURS["lars_mixed"], True, path)
    _assert_state_skipped(model, before, messages, weights)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ours", sorted(OURS))
def test_a_built_mixed_optimizer_loads_its_own_checkpoint_bit_exact(
        written, ours, fmt):
    path, weights, state = written(ours, fmt)
    model, _, messages = _read(OURS[ours], True, path)
    assert not any(SKIPPED in m for m in messages), messages
    after = _values(model.optimizer.variables)
    assert len(after) == len(state)
    for a, b in zip(state, after):
        np.testing.assert_array_equal(a, b)
    assert float(keras.ops.convert_to_numpy(
        model.optimizer.dynamic_scale)) == 2.0**17
    for a, b in zip(weights, _values(model.weights)):
        np.testing.assert_array_equal(a, b)


def test_an_unbuilt_mixed_optimizer_skips_its_own_checkpoint_with_a_warning(
        written):
    path, weights, _ = written("lars_mixed", "weights.h5")
    model, before, messages = _read(OURS["lars_mixed"], False, path)
    _assert_state_skipped(model, before, messages, weights)
    assert any("not been called/built yet" in m for m in messages)
