"""The CIFAR-style ResNet of He et al. 2016, §4.2 (all three backends)."""

import keras
import numpy as np
import pytest

from keras_largebatch.applications import ResNetCIFAR
from keras_largebatch.applications import resnet_cifar


def _expected_params(depth, width, channels, classes):
    # Independent count: 3x3 convs without bias, BN gamma/beta (+ moving
    # mean/variance), option-A shortcuts without parameters, a dense head.
    n = (depth - 2) // 6
    convs = 9 * channels * width
    bn = width
    cin = width
    for stage in range(3):
        w = width * 2**stage
        for _ in range(n):
            convs += 9 * cin * w + 9 * w * w
            bn += 2 * w
            cin = w
    dense = cin * classes + classes
    return convs + 2 * bn + dense, convs + 4 * bn + dense


def test_resnet20_has_the_papers_0_27_million_parameters():
    model = ResNetCIFAR(20, 16, input_shape=(32, 32, 3), classes=10)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert trainable == 269_722
    assert model.count_params() == 271_098
    assert (trainable, model.count_params()) == _expected_params(20, 16, 3, 10)


@pytest.mark.parametrize("depth,width", [(8, 4), (14, 8), (32, 16)])
def test_parameter_count_follows_depth_and_width(depth, width):
    model = ResNetCIFAR(depth, width, input_shape=(28, 28, 1), classes=10)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert (trainable, model.count_params()) == _expected_params(
        depth, width, 1, 10)
    convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
    assert len(convs) + 1 == depth  # 6n + 1 convs and the dense layer


def test_fashion_mnist_shaped_input_gives_class_probabilities():
    model = ResNetCIFAR(8, 4, input_shape=(28, 28, 1), classes=10)
    x = np.random.default_rng(0).random((3, 28, 28, 1), "float32")
    y = keras.ops.convert_to_numpy(model(x))
    assert y.shape == (3, 10)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    # Stages end at 28, 14 and 7 pixels.
    assert model.get_layer("conv4_block1_out").output.shape[1:] == (7, 7, 16)


def test_option_a_shortcut_subsamples_and_pads_with_zeros():
    x = np.random.default_rng(1).normal(size=(2, 6, 6, 3)).astype("float32")
    sub = keras.layers.MaxPooling2D(1, strides=2)(x)
    out = keras.ops.convert_to_numpy(resnet_cifar.PadChannels(5)(sub))
    assert out.shape == (2, 3, 3, 8)
    np.testing.assert_array_equal(out[..., :3], x[:, ::2, ::2, :])
    np.testing.assert_array_equal(out[..., 3:], 0.0)


def test_a_few_steps_lower_the_training_loss():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 3, 64)
    x = rng.random((64, 12, 12, 1), "float32") + labels[:, None, None, None]
    y = keras.utils.to_categorical(labels, 3)
    model = ResNetCIFAR(8, 4, input_shape=(12, 12, 1), classes=3)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="categorical_crossentropy")
    loss = model.fit(x, y, batch_size=16, epochs=6, verbose=0).history["loss"]
    assert loss[-1] < 0.5 * loss[0]


def test_saved_model_loads_back_with_the_same_outputs(tmp_path):
    model = ResNetCIFAR(8, 4, input_shape=(12, 12, 1), classes=3)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    x = np.random.default_rng(3).random((2, 12, 12, 1), "float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)),
                               keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs,match",
    [({"depth": 21}, "`depth`.*Received: depth=21"),
     ({"depth": 2}, "`depth`.*Received: depth=2"),
     ({"depth": 20.0}, "`depth`.*Received: depth=20.0"),
     ({"width": 0}, "`width`.*Received: width=0"),
     ({"classes": 0}, "`classes`.*Received: classes=0"),
     ({"input_shape": (3, 3, 1)}, "at least 4x4"),
     ({"include_top": False, "pooling": "sum"}, "`pooling`")],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNetCIFAR(**kwargs)
