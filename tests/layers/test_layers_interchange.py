"""On every backend: the layers are Keras' with the same config, variables
and outputs; weights, `.keras` files and whole models (`swap_in`,
`to_stock`) interchange both ways; the applications load files written
with Keras' own layers."""

import inspect
import json
import zipfile

import keras
import numpy as np
import pytest

from keras_largebatch import layers
from keras_largebatch.applications import ResNetCIFAR

PAIRS = [(layers.Conv2D, keras.layers.Conv2D,
          dict(filters=4, kernel_size=3, strides=2, padding="same")),
         (layers.BatchNormalization, keras.layers.BatchNormalization,
          dict(momentum=0.5)),
         (layers.MaxPooling2D, keras.layers.MaxPooling2D, dict(pool_size=2)),
         (layers.Activation, keras.layers.Activation,
          dict(activation="relu")),
         (layers.Add, keras.layers.Add, {}),
         (layers.ZeroPadding2D, keras.layers.ZeroPadding2D,
          dict(padding=((1, 2), (0, 1))))]
OURS = tuple(p[0] for p in PAIRS)
STOCK = tuple(p[1] for p in PAIRS)
X = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")


def _model(conv, bn, pool, activation, add, pad):
    inputs = keras.Input((8, 8, 3))
    x = conv(4, 3, strides=2, padding="same", name="conv")(inputs)
    y = bn(momentum=0.5, name="bn")(x)
    x = add(name="add")([activation("relu", name="relu")(y), x])
    x = pool(2, name="pool")(pad(((1, 0), (0, 1)), name="pad")(x))
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x))


def _randomize(model, seed=1):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        value = rng.normal(size=v.shape)
        v.assign(np.abs(value) + 0.5 if "variance" in v.path else value)


@pytest.mark.parametrize("ours,stock,kwargs", PAIRS,
                         ids=lambda v: getattr(v, "__name__", None))
def test_same_constructor_config_and_variable_names_as_keras(
        ours, stock, kwargs):
    assert issubclass(ours, stock) and ours.__name__ == stock.__name__
    assert (inspect.signature(ours.__init__)
            == inspect.signature(stock.__init__))
    a, b = ours(name="x", **kwargs), stock(name="x", **kwargs)
    shape = [X.shape, X.shape] if stock is keras.layers.Add else X.shape
    a.build(shape)
    b.build(shape)
    assert a.get_config() == b.get_config()
    assert ([(v.name, v.shape, v.trainable) for v in a.weights]
            == [(v.name, v.shape, v.trainable) for v in b.weights])
    assert (keras.saving.get_registered_name(ours)
            == f"keras_largebatch>{ours.__name__}")


@pytest.mark.parametrize("training", [True, False])
def test_model_of_our_layers_computes_what_keras_layers_do(training):
    stock = _model(*STOCK)
    _randomize(stock)
    ours = layers.swap_in(stock)
    assert {type(l) for l in ours.layers} >= set(OURS)
    for _ in range(2):
        got = keras.ops.convert_to_numpy(ours(X, training=training))
        want = keras.ops.convert_to_numpy(stock(X, training=training))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(ours.weights, stock.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a),
                                   keras.ops.convert_to_numpy(b),
                                   rtol=1e-5, atol=1e-6)


def test_weights_files_interchange_both_ways(tmp_path):
    stock = _model(*STOCK)
    ours = _model(*OURS)
    for source, target in ((stock, ours), (ours, stock)):
        _randomize(source, seed=id(source) % 1000)
        path = str(tmp_path / "w.weights.h5")
        source.save_weights(path)
        target.load_weights(path)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(target(X, training=False)),
            keras.ops.convert_to_numpy(source(X, training=False)),
            rtol=1e-5, atol=1e-5)


def _class_names(path):
    with zipfile.ZipFile(path) as archive:
        config = archive.read("config.json").decode()
    return {(l["class_name"], l.get("registered_name") or l["module"])
            for l in json.loads(config)["config"]["layers"]}


def test_keras_file_round_trips_and_to_stock_writes_only_keras_classes(
        tmp_path):
    ours = _model(*OURS)
    _randomize(ours)
    want = keras.ops.convert_to_numpy(ours(X, training=False))
    path = str(tmp_path / "ours.keras")
    ours.save(path)
    assert ("Conv2D", "keras_largebatch>Conv2D") in _class_names(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.get_layer("bn")) is layers.BatchNormalization
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(X, training=False)), want,
        rtol=1e-5, atol=1e-5)

    stock = layers.to_stock(ours)
    path = str(tmp_path / "stock.keras")
    stock.save(path)
    names = _class_names(path)
    assert not any("keras_largebatch" in str(n) for n in names), names
    assert [l.name for l in stock.layers[1:]] == [l.name for l in ours.layers[1:]]
    loaded = keras.saving.load_model(path)
    assert type(loaded.get_layer("conv")) is keras.layers.Conv2D
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(X, training=False)), want,
        rtol=1e-5, atol=1e-5)


def test_a_swapped_model_keeps_its_weights_while_the_source_trains():
    # Copies, not shared buffers: JAX's train step donates (deletes) the
    # source's arrays, torch's optimizer updates them in place.
    ours = _model(*OURS)
    _randomize(ours)
    stock = layers.to_stock(ours)
    before = [keras.ops.convert_to_numpy(v) for v in stock.weights]
    ours.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    ours.fit(X, np.ones((len(X), 3), "float32"), epochs=1, verbose=0)
    assert not np.array_equal(keras.ops.convert_to_numpy(ours.weights[0]),
                              before[0])
    for v, value in zip(stock.weights, before):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), value)
    stock.predict(X, verbose=0)


def _sequential(conv, bn, *_):
    return keras.Sequential([keras.Input((8, 8, 3), name="images"),
                             conv(4, 3, name="conv"), bn(name="bn")])


@pytest.mark.parametrize("build", [_model, _sequential],
                         ids=["functional", "sequential"])
@pytest.mark.parametrize("swap", ["swap_in", "to_stock"])
def test_a_swapped_compiled_model_is_uncompiled_with_its_input_names(
        build, swap):
    model = build(*(STOCK if swap == "swap_in" else OURS))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    new = getattr(layers, swap)(model)
    assert not new.compiled and getattr(new, "optimizer", None) is None
    assert model.compiled and model.optimizer is not None
    assert ([l.name for l in new.layers] == [l.name for l in model.layers])
    assert (new.get_config()["layers"][0]["config"]["name"]
            == model.get_config()["layers"][0]["config"]["name"])


def test_to_stock_of_a_model_trained_with_lars_mixed_saves_no_optimizer(
        tmp_path):
    from keras_largebatch.optimizers import LARSMixed

    ours = _model(*OURS)
    _randomize(ours)
    ours.compile(optimizer=LARSMixed(0.1), loss="mse")
    ours.fit(X, np.ones((len(X), 3), "float32"), epochs=1, verbose=0)
    want = keras.ops.convert_to_numpy(ours(X, training=False))
    stock = layers.to_stock(ours)
    assert not stock.compiled
    path = str(tmp_path / "stock.keras")
    stock.save(path)
    with zipfile.ZipFile(path) as archive:
        config = archive.read("config.json").decode()
    assert not json.loads(config)["compile_config"]
    assert "keras_largebatch" not in config  # loads without the package
    loaded = keras.saving.load_model(path)
    assert not loaded.compiled
    assert [l.name for l in loaded.layers] == [l.name for l in ours.layers]
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(X, training=False)), want,
        rtol=1e-5, atol=1e-5)


def test_swap_refuses_what_is_not_a_model():
    with pytest.raises(ValueError, match="Received: model="):
        layers.to_stock(keras.layers.Dense(2))


def test_application_loads_a_checkpoint_written_with_keras_layers(tmp_path):
    model = ResNetCIFAR(depth=8, width=4, input_shape=(8, 8, 3), classes=3)
    assert type(model.get_layer("conv1_conv")) is layers.Conv2D
    stock = layers.to_stock(model)
    assert type(stock.get_layer("conv1_conv")) is keras.layers.Conv2D
    assert type(stock.get_layer("conv1_relu")) is keras.layers.Activation
    _randomize(stock)
    path = str(tmp_path / "before.weights.h5")
    stock.save_weights(path)  # as a build before this change wrote it
    rebuilt = ResNetCIFAR(depth=8, width=4, input_shape=(8, 8, 3), classes=3,
                          name=model.name)
    rebuilt.load_weights(path)
    for training in (False, True):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(rebuilt(X, training=training)),
            keras.ops.convert_to_numpy(stock(X, training=training)),
            rtol=1e-4, atol=1e-5)
