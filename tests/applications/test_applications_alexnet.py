"""AlexNetBN: layout, parameter count, minimum input, checkpoints, errors."""

import h5py
import keras
import numpy as np
import pytest
from keras.src.legacy.saving import legacy_h5_format

from keras_largebatch.applications import AlexNetBN
from keras_largebatch.applications import alexnet_bn
from keras_largebatch.applications import load_weights_except_classifier

MIN = 67


def _np(x):
    return keras.ops.convert_to_numpy(x)


def test_full_size_model_has_the_published_parameter_count():
    model = AlexNetBN()
    assert model.input_shape == (None, 227, 227, 3)
    assert model.count_params() == 60_970_728
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == 60_967_976
    assert model.get_layer("flatten").output.shape == (None, 6 * 6 * 256)


def test_layout_names_groups_and_shapes_at_minimum_input():
    model = AlexNetBN(input_shape=(MIN, MIN, 3), classes=10)
    names = [l.name for l in model.layers[1:]]
    assert names == [
        "conv1", "pool1", "bn1", "conv2", "pool2", "bn2", "conv3", "bn3",
        "conv4", "bn4", "conv5", "pool5", "bn5", "flatten", "fc6",
        "fc6_dropout", "fc7", "fc7_dropout", "predictions",
    ]
    # (kernel shape, output spatial size): groups=2 halves the kernel's
    # input channels of conv2, conv4 and conv5.
    expected = {
        "conv1": ((11, 11, 3, 96), 15),
        "conv2": ((5, 5, 48, 256), 7),
        "conv3": ((3, 3, 256, 384), 3),
        "conv4": ((3, 3, 192, 384), 3),
        "conv5": ((3, 3, 192, 256), 3),
    }
    for name, (kernel, size) in expected.items():
        layer = model.get_layer(name)
        assert tuple(layer.kernel.shape) == kernel
        assert layer.bias is not None
        assert layer.output.shape[1:3] == (size, size)
    assert model.get_layer("pool5").output.shape[1:] == (1, 1, 256)
    for i in range(1, 6):
        bn = model.get_layer(f"bn{i}")
        assert bn.center and bn.scale
    assert model.get_layer("fc6").kernel.shape == (256, 4096)
    assert model.get_layer("predictions").kernel.shape == (4096, 10)


def test_grouped_convs_train_one_step_at_minimum_input():
    model = AlexNetBN(input_shape=(MIN, MIN, 3), classes=4, dropout=0.0)
    conv2 = _np(model.get_layer("conv2").kernel)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (4, MIN, MIN, 3)).astype("float32")
    y = np.array([0, 1, 2, 3])
    history = model.fit(
        alexnet_bn.preprocess_input(x), y, batch_size=4, epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"][0])
    assert not np.allclose(_np(model.get_layer("conv2").kernel), conv2)


def test_checkpoint_loads_and_transfers_to_another_class_count(tmp_path):
    source = AlexNetBN(input_shape=(MIN, MIN, 3), classes=5)
    rng = np.random.default_rng(1)
    for v in source.weights:
        v.assign(rng.uniform(0.5, 1.5, v.shape))
    paths = {"h5": str(tmp_path / "alex.h5")}
    with h5py.File(paths["h5"], "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, source)
    paths["weights.h5"] = str(tmp_path / "alex.weights.h5")
    source.save_weights(paths["weights.h5"])

    same = AlexNetBN(
        input_shape=(MIN, MIN, 3), classes=5, weights=paths["weights.h5"]
    )
    for a, b in zip(same.weights, source.weights):
        np.testing.assert_array_equal(_np(a), _np(b))

    for path in paths.values():
        target = AlexNetBN(input_shape=(MIN, MIN, 3), classes=3)
        head = _np(target.get_layer("predictions").kernel)
        load_weights_except_classifier(target, path)
        for layer in target.layers:
            if not layer.weights:
                continue
            if layer.name == "predictions":
                np.testing.assert_array_equal(_np(layer.kernel), head)
                continue
            for a, b in zip(
                layer.weights, source.get_layer(layer.name).weights
            ):
                np.testing.assert_array_equal(_np(a), _np(b))


def test_feature_extractor_without_top_accepts_any_size_from_minimum():
    model = AlexNetBN(include_top=False, pooling="avg")
    assert model.input_shape == (None, None, None, 3)
    x = np.ones((1, 80, 96, 3), "float32")
    assert _np(model.predict(x, verbose=0)).shape == (1, 256)
    assert AlexNetBN(include_top=False).output_shape == (None, None, None, 256)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_shape": (66, 66, 3)}, "at least 67x67"),
        ({"include_top": False, "input_shape": (227, 66, 3)}, "at least 67"),
        ({"weights": "imagenet"}, "no official ImageNet weights"),
        ({"weights": "/nonexistent/alex.weights.h5"},
         "/nonexistent/alex.weights.h5"),
        ({"include_top": True, "input_shape": (None, None, 3)},
         "known height and width"),
        ({"dropout": 1.0}, "`dropout`"),
        ({"include_top": False, "pooling": "mean"}, "`pooling`"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlexNetBN(**kwargs)


def test_preprocess_input_is_caffe_mode():
    x = np.random.default_rng(3).uniform(0, 255, (2, 4, 4, 3))
    expected = x[..., ::-1] - np.array([103.939, 116.779, 123.68])
    got = alexnet_bn.preprocess_input(x.astype("float32"))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_file_of_another_architecture_is_rejected_naming_file_and_layer(
    tmp_path,
):
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(64, 7, strides=2, name="conv1")(inputs)
    other = keras.Model(inputs, x)
    path = str(tmp_path / "other.h5")
    with h5py.File(path, "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, other)
    with pytest.raises(ValueError) as e:
        AlexNetBN(include_top=False, input_shape=(MIN, MIN, 3), weights=path)
    assert path in str(e.value)
    assert "layer `conv1` expects shapes" in str(e.value)
