"""Loaders of keras-largebatch-train on small data made by the tests."""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.tensorflow

from keras_largebatch.train import data  # noqa: E402


def _png(path, value, size=12):
    image = np.full((size, size, 3), value, "uint8")
    tf.io.write_file(path, tf.io.encode_png(image))


def _jpeg_bytes(value, size=16):
    image = np.full((size, size, 3), value, "uint8")
    return tf.io.encode_jpeg(image, quality=100).numpy()


def _class_folders(root, values, per_class=4):
    for name, value in values.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            _png(os.path.join(root, name, f"{i}.png"), value)


def _all(dataset):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in dataset])
    return np.stack(xs), np.stack(ys)


def test_digits_is_a_stratified_80_20_split_of_the_1797_scans():
    spec = data.load("digits", image_size=16)
    assert (spec.num_train, spec.num_validation, spec.num_classes) == (
        1437, 360, 10)
    x, y = _all(spec.validation)
    assert x.shape == (360, 16, 16, 3)
    assert 0.0 <= x.min() and x.max() <= 1.0 + 1e-6
    np.testing.assert_array_equal(x[..., 0], x[..., 2])
    counts = np.bincount(y.argmax(1), minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    np.testing.assert_array_equal(y.sum(1), np.ones(360))


def test_directory_labels_follow_sorted_class_folders(tmp_path):
    values = {"a_dark": 20, "b_mid": 120, "c_light": 230}
    _class_folders(str(tmp_path / "train"), values, per_class=4)
    _class_folders(str(tmp_path / "validation"), values, per_class=2)
    spec = data.load("directory", image_size=8, data_dir=str(tmp_path))
    assert (spec.num_train, spec.num_validation, spec.num_classes) == (12, 6, 3)
    for split in (spec.train, spec.validation):
        x, y = _all(split)
        assert x.shape[1:] == (8, 8, 3)
        expected = np.array([20, 120, 230])[y.argmax(1)] / 255.0
        np.testing.assert_allclose(x.mean(axis=(1, 2, 3)), expected,
                                   atol=1e-5)


def test_directory_without_split_folders_is_split_80_20(tmp_path):
    _class_folders(str(tmp_path), {"x": 10, "y": 200}, per_class=5)
    spec = data.load("directory", image_size=8, data_dir=str(tmp_path))
    assert (spec.num_train, spec.num_validation) == (8, 2)


def test_corrupt_image_is_named_before_training(tmp_path):
    _class_folders(str(tmp_path), {"x": 10, "y": 200}, per_class=5)
    bad = tmp_path / "y" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(data.DataError, match="broken.jpg"):
        data.load("directory", image_size=8, data_dir=str(tmp_path))


def test_missing_directory_is_rejected(tmp_path):
    with pytest.raises(data.DataError, match="data_dir"):
        data.load("directory", image_size=8,
                  data_dir=str(tmp_path / "nowhere"))


def _example(value, label):
    feature = {
        "image/encoded": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[_jpeg_bytes(value)])),
        "image/class/label": tf.train.Feature(
            int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(
        features=tf.train.Features(feature=feature)).SerializeToString()


def _write_records(path, items):
    with tf.io.TFRecordWriter(path) as writer:
        for value, label in items:
            writer.write(_example(value, label))


def test_tfrecord_labels_are_one_based_like_the_models_garden(tmp_path):
    # Class c (1-based) is an image of brightness 50 * c.
    train = [(50 * c, c) for c in (1, 2, 3, 4)] * 2
    _write_records(str(tmp_path / "train-00000-of-00002"), train[:5])
    _write_records(str(tmp_path / "train-00001-of-00002"), train[5:])
    _write_records(str(tmp_path / "validation-00000-of-00001"),
                   [(50 * c, c) for c in (4, 1)])
    spec = data.load("tfrecord", image_size=8, data_dir=str(tmp_path),
                     num_classes=4, num_examples=(8, 2))
    assert (spec.num_train, spec.num_validation, spec.num_classes) == (8, 2, 4)
    x, y = _all(spec.validation)
    np.testing.assert_array_equal(y.argmax(1), [3, 0])
    np.testing.assert_allclose(x.mean(axis=(1, 2, 3)),
                               [200 / 255, 50 / 255], atol=2 / 255)
    x, y = _all(spec.train_for_epoch(0, 0))
    assert len(x) == 8
    np.testing.assert_allclose(x.mean(axis=(1, 2, 3)),
                               50 * (y.argmax(1) + 1) / 255, atol=2 / 255)


def test_tfrecord_without_imagenet_features_is_rejected(tmp_path):
    for split in ("train", "validation"):
        with tf.io.TFRecordWriter(str(tmp_path / f"{split}-0")) as writer:
            feature = {"label": tf.train.Feature(
                int64_list=tf.train.Int64List(value=[1]))}
            writer.write(tf.train.Example(features=tf.train.Features(
                feature=feature)).SerializeToString())
    with pytest.raises(data.DataError, match="ImageNet-format"):
        data.load("tfrecord", image_size=8, data_dir=str(tmp_path))


def test_tfrecord_label_zero_is_rejected_as_not_one_based(tmp_path):
    for split in ("train", "validation"):
        _write_records(str(tmp_path / f"{split}-0"), [(10, 0)])
    with pytest.raises(data.DataError, match="1-based"):
        data.load("tfrecord", image_size=8, data_dir=str(tmp_path),
                  num_classes=3)


def test_batches_are_normalized_to_minus_one_one(tmp_path):
    spec = data.load("synthetic", image_size=8, num_classes=3)
    train, val = data.batch(spec, 16)
    x, y = next(iter(train))
    assert tuple(x.shape) == (16, 8, 8, 3) and tuple(y.shape) == (16, 3)
    assert -1.0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 1.0
    assert float(tf.reduce_min(x)) < -0.9 and float(tf.reduce_max(x)) > 0.9


def test_tf_data_processes_read_slices_that_tile_the_global_batch():
    # Several JAX or torch processes on tf.data: process p keeps rows
    # [p * B / P, (p + 1) * B / P) of each augmented batch, train and
    # validation alike; together they are the one process's batches.
    from keras_largebatch.train.data import augment
    from keras_largebatch.train.data import tf_pipeline

    rng = np.random.default_rng(0)
    x = rng.random((50, 8, 8, 1), "float32")
    y = np.arange(50) % 4
    spec = data.from_arrays("t", x, y, x[:24], y[:24], 4, 8, 3)
    kwargs = dict(augmenter=augment.build("crop_flip", 8, 1), seed=3,
                  drop_remainder=True, steps_per_epoch=5, epochs=2)
    whole = [_all(d) for d in tf_pipeline.batch(spec, 12, **kwargs)]
    parts = [[_all(d) for d in tf_pipeline.batch(
        spec, 12, process_index=p, process_count=3, **kwargs)]
        for p in range(3)]
    for i in range(2):  # train, validation
        for j in range(2):  # images, labels
            tiled = np.concatenate([parts[p][i][j] for p in range(3)],
                                   axis=1)
            assert tiled.shape == whole[i][j].shape
            np.testing.assert_array_equal(tiled, whole[i][j])
    assert whole[0][0].shape[:2] == (10, 12)
    assert parts[1][0][0].shape[:2] == (10, 4)


_MEMORY = r"""
import resource, sys
import numpy as np
from keras_largebatch.train import data

x = np.random.default_rng(0).random((5_000, 28, 28, 1), "float32")
y = np.arange(5_000) % 10
spec = data.from_arrays("arrays", x, y, x[:100], y[:100], 10, 28, None)
train, _ = data.batch(spec, 256, None, 0, True, epochs=int(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
next(iter(train))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_memory_of_in_memory_data_does_not_grow_with_the_epochs():
    # The training pipeline holds one sub-pipeline per epoch over the same
    # arrays; tf.data's default rewrite, if it were on, would copy the
    # arrays into each (16 MB here: +0.4 GB at 24 epochs).
    import subprocess
    import sys

    grown = []
    for epochs in (2, 24):
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY, str(epochs)], check=True,
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, KERAS_BACKEND="tensorflow"))
        grown.append(int(out.stdout.split()[-1]))
    size = 5_000 * 28 * 28 * 4
    assert grown[1] - grown[0] < 2 * size, grown
