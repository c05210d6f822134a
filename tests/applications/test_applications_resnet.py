"""ResNet50: Keras weight compatibility, variants, errors. Runs on 3 backends.

The official ImageNet files cannot be downloaded here, so stand-ins are made
from `keras.applications.ResNet50(weights=None)` with randomized weights and
saved in both formats the official files come in.
"""

import hashlib
import os
import shutil

import h5py
import keras
import numpy as np
import pytest
from keras.src.legacy.saving import legacy_h5_format

from keras_largebatch.applications import ResNet50
from keras_largebatch.applications import load_weights_except_classifier
from keras_largebatch.applications import resnet

SIZE = 32
X = np.random.default_rng(0).uniform(0, 255, (2, SIZE, SIZE, 3)).astype(
    "float32"
)


def _randomize(model, seed):
    """Random BN statistics and biases, so wrong loading shows in outputs."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        n = v.path.split("/")[-1]
        if n in ("gamma", "moving_variance"):
            v.assign(rng.uniform(0.7, 1.3, v.shape))
        elif n in ("beta", "moving_mean", "bias"):
            v.assign(rng.normal(0, 0.1, v.shape))


def _save_legacy_h5(model, path):
    with h5py.File(path, "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, model)


def _predict(model, x=X):
    return keras.ops.convert_to_numpy(model.predict(x, verbose=0))


def _assert_same(a, b):
    assert a.shape == b.shape
    rel = np.max(np.abs(a - b)) / np.max(np.abs(b))
    assert rel <= 1e-4, rel


@pytest.fixture(scope="module")
def keras_top(tmp_path_factory):
    """A Keras ResNet50 with random weights, its logits and both files."""
    d = tmp_path_factory.mktemp("keras_top")
    model = keras.applications.ResNet50(
        weights=None, input_shape=(SIZE, SIZE, 3), classifier_activation=None
    )
    _randomize(model, 1)
    files = {"weights.h5": str(d / "r50.weights.h5"), "h5": str(d / "r50.h5")}
    model.save_weights(files["weights.h5"])
    _save_legacy_h5(model, files["h5"])
    weights = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    return {"logits": _predict(model), "files": files, "weights": weights}


@pytest.fixture(scope="module")
def keras_notop(tmp_path_factory):
    d = tmp_path_factory.mktemp("keras_notop")
    model = keras.applications.ResNet50(
        weights=None, include_top=False, input_shape=(SIZE, SIZE, 3),
        pooling="avg",
    )
    _randomize(model, 2)
    path = str(d / "r50_notop.h5")
    _save_legacy_h5(model, path)
    return {"features": _predict(model), "file": path}


def test_v1_has_keras_layer_names_classes_and_weight_shapes():
    # keras_largebatch.layers' Conv2D, BatchNormalization and MaxPooling2D
    # are subclasses of Keras' with the same names (tests/layers).
    ours = ResNet50(input_shape=(SIZE, SIZE, 3))
    ref = keras.applications.ResNet50(weights=None, input_shape=(SIZE, SIZE, 3))
    assert all(isinstance(a, type(b)) for a, b in zip(ours.layers, ref.layers))
    describe = lambda m: [  # noqa: E731
        (type(l).__name__, l.name, [tuple(w.shape) for w in l.weights])
        for l in m.layers
        if not isinstance(l, keras.layers.InputLayer)
    ]
    assert describe(ours) == describe(ref)
    assert ours.count_params() == ref.count_params() == 25_636_712


@pytest.mark.parametrize("fmt", ["weights.h5", "h5"])
def test_keras_resnet50_files_load_and_give_identical_outputs(keras_top, fmt):
    model = ResNet50(
        weights=keras_top["files"][fmt],
        input_shape=(SIZE, SIZE, 3),
        classifier_activation=None,
    )
    _assert_same(_predict(model), keras_top["logits"])


def test_notop_legacy_file_loads_into_feature_extractor(keras_notop):
    model = ResNet50(
        include_top=False, weights=keras_notop["file"], pooling="avg",
        input_shape=(SIZE, SIZE, 3),
    )
    assert model.output_shape == (None, 2048)
    _assert_same(_predict(model), keras_notop["features"])


def test_imagenet_uses_keras_url_hash_and_cache_without_network(
    keras_top, tmp_path, monkeypatch
):
    # The stand-in cannot have the official md5, so the table is pointed at
    # the stand-in's md5; everything else (URL, file name, cache lookup,
    # hash check) is Keras' real `get_file` path, with downloads blocked.
    from keras.src.backend import config
    from keras.src.utils import file_utils

    fname = "resnet50_weights_tf_dim_ordering_tf_kernels.h5"
    os.makedirs(tmp_path / "models")
    shutil.copy(keras_top["files"]["h5"], tmp_path / "models" / fname)
    with open(tmp_path / "models" / fname, "rb") as f:
        md5 = hashlib.md5(f.read()).hexdigest()

    def no_network(*args, **kwargs):
        raise AssertionError(f"tried to download {args[0]}")

    monkeypatch.setattr(file_utils, "urlretrieve", no_network)
    monkeypatch.setattr(config, "keras_home", lambda: str(tmp_path))
    monkeypatch.setitem(resnet.WEIGHTS_HASHES, "resnet50", (md5, "unused"))
    model = ResNet50(
        weights="imagenet", input_shape=(SIZE, SIZE, 3),
        classifier_activation=None,
    )
    _assert_same(_predict(model), keras_top["logits"])

    # A cached file whose hash is not the official one is not trusted:
    # Keras' get_file tries to download it again.
    monkeypatch.setitem(resnet.WEIGHTS_HASHES, "resnet50", ("0" * 32,) * 2)
    with pytest.raises(AssertionError, match="tried to download"):
        resnet.imagenet_weights_path(include_top=True)


def test_imagenet_file_names_urls_and_hashes_are_keras_own(monkeypatch):
    from keras.src.applications import resnet as keras_resnet

    assert resnet.BASE_WEIGHTS_PATH == keras_resnet.BASE_WEIGHTS_PATH
    assert (
        resnet.WEIGHTS_HASHES["resnet50"]
        == keras_resnet.WEIGHTS_HASHES["resnet50"]
    )
    calls = []
    monkeypatch.setattr(
        keras.utils, "get_file", lambda *a, **k: calls.append((a, k)) or "x"
    )
    resnet.imagenet_weights_path(include_top=True)
    resnet.imagenet_weights_path(include_top=False)
    base = "resnet50_weights_tf_dim_ordering_tf_kernels"
    assert calls == [
        (
            (f"{base}.h5", keras_resnet.BASE_WEIGHTS_PATH + f"{base}.h5"),
            {"cache_subdir": "models",
             "file_hash": keras_resnet.WEIGHTS_HASHES["resnet50"][0]},
        ),
        (
            (f"{base}_notop.h5",
             keras_resnet.BASE_WEIGHTS_PATH + f"{base}_notop.h5"),
            {"cache_subdir": "models",
             "file_hash": keras_resnet.WEIGHTS_HASHES["resnet50"][1]},
        ),
    ]


def test_v1_5_moves_stride_to_3x3_and_loads_v1_weights(keras_top):
    model = ResNet50(
        weights=keras_top["files"]["h5"], input_shape=(SIZE, SIZE, 3),
        variant="v1.5", classifier_activation=None,
    )
    for stage in (3, 4, 5):
        block = f"conv{stage}_block1"
        assert model.get_layer(f"{block}_1_conv").strides == (1, 1)
        assert model.get_layer(f"{block}_2_conv").strides == (2, 2)
        assert model.get_layer(f"{block}_0_conv").strides == (2, 2)
    assert model.get_layer("conv2_block1_2_conv").strides == (1, 1)
    # Same weights, different function.
    w = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}
    assert w.keys() == keras_top["weights"].keys()
    for k in w:
        np.testing.assert_array_equal(w[k], keras_top["weights"][k])
    logits = _predict(model)
    assert np.max(np.abs(logits - keras_top["logits"])) > 1e-3


def test_zero_init_residual_zeroes_only_last_bn_gamma_of_each_block():
    model = ResNet50(
        include_top=False, input_shape=(SIZE, SIZE, 3), zero_init_residual=True
    )
    bn = keras.layers.BatchNormalization
    bns = [l for l in model.layers if isinstance(l, bn)]
    last = [l for l in bns if l.name.endswith("_3_bn")]
    assert len(last) == 16
    for layer in bns:
        gamma = keras.ops.convert_to_numpy(layer.gamma)
        expected = 0.0 if layer.name.endswith("_3_bn") else 1.0
        np.testing.assert_array_equal(gamma, expected)


def test_classifier_output_is_float32_under_mixed_precision():
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = ResNet50(input_shape=(SIZE, SIZE, 3), classes=10)
    finally:
        keras.config.set_dtype_policy(policy)
    assert model.get_layer("conv1_conv").compute_dtype == "float16"
    assert model.get_layer("predictions").compute_dtype == "float32"
    assert model.output.dtype == "float32"
    probs = _predict(model)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)


def test_conv_biases_fold_into_bn_when_model_has_none(keras_top):
    model = ResNet50(
        weights=keras_top["files"]["weights.h5"], input_shape=(SIZE, SIZE, 3),
        use_conv_bias=False, classifier_activation=None,
    )
    assert model.count_params() == 25_636_712 - 26_560
    _assert_same(_predict(model), keras_top["logits"])


def test_fine_tuning_helper_loads_all_but_classifier(keras_top):
    model = ResNet50(input_shape=(SIZE, SIZE, 3), classes=7)
    head = [keras.ops.convert_to_numpy(w) for w in model.layers[-1].weights]
    with pytest.raises(ValueError, match="layer `predictions` expects"):
        resnet.weights_lib.load_weights(model, keras_top["files"]["h5"])
    load_weights_except_classifier(model, keras_top["files"]["h5"])
    for v in model.weights:
        got = keras.ops.convert_to_numpy(v)
        if v.path.startswith("predictions/"):
            assert got.shape[-1] == 7
        else:
            np.testing.assert_array_equal(got, keras_top["weights"][v.path])
    for w, before in zip(model.layers[-1].weights, head):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(w), before)


def test_file_of_another_architecture_is_rejected_naming_file_and_layer(
    tmp_path,
):
    from keras_largebatch.applications import AlexNetBN

    other = AlexNetBN(include_top=False, input_shape=(67, 67, 3))
    legacy, v3 = str(tmp_path / "alex.h5"), str(tmp_path / "alex.weights.h5")
    _save_legacy_h5(other, legacy)
    other.save_weights(v3)
    for path, detail in [(legacy, "has no weights"), (v3, "expects shapes")]:
        with pytest.raises(ValueError) as e:
            ResNet50(weights=path, include_top=False, input_shape=(32, 32, 3))
        assert path in str(e.value)
        assert "`conv1_conv`" in str(e.value)
        assert detail in str(e.value)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_shape": (31, 64, 3)}, "at least 32x32"),
        ({"include_top": False, "input_shape": (64, 16, 3)}, "at least 32x32"),
        ({"weights": "imagenet", "classes": 10}, "`classes` must be 1000"),
        ({"weights": "/nonexistent/r50.h5"}, "/nonexistent/r50.h5"),
        ({"weights": "r50.ckpt"}, "must end in"),
        ({"weights": 3}, "`weights` must be None"),
        ({"variant": "v2"}, "`variant`"),
        ({"include_top": False, "pooling": "sum"}, "`pooling`"),
        ({"classes": 0}, "`classes`"),
        ({"weights": "imagenet", "classifier_activation": "relu"},
         "`classifier_activation`"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNet50(**kwargs)


def test_preprocess_input_is_caffe_mode():
    x = np.random.default_rng(3).uniform(0, 255, (2, 4, 4, 3))
    expected = x[..., ::-1] - np.array([103.939, 116.779, 123.68])
    got = resnet.preprocess_input(x.astype("float32"))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
