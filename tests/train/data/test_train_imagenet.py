"""ImageNet-format TFRecords: counts without a scan, lazy checks, crops,
normalization and file sharding, on small shards made here."""

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.tensorflow

from keras_largebatch.train import data  # noqa: E402
from keras_largebatch.train.data import imagenet  # noqa: E402

# (height, width) of the JPEGs: square, wide, tall, small, odd.
SHAPES = [(64, 64), (48, 96), (120, 60), (33, 47), (80, 100)]


def _framed(height, width):
    """White central square of the shorter side, black around it."""
    image = np.zeros((height, width, 3), "uint8")
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    image[top:top + side, left:left + side] = 255
    return image


def _example(image, label):
    encoded = tf.io.encode_jpeg(image, quality=95).numpy()
    feature = {
        "image/encoded": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[encoded])),
        "image/class/label": tf.train.Feature(
            int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(
        features=tf.train.Features(feature=feature)).SerializeToString()


def _shards(root, num_files=4, per_file=5, garbage_after_first=False):
    """train-0000i: labels 1 + i (one class per file); validation-0."""
    os.makedirs(root, exist_ok=True)
    for i in range(num_files):
        path = os.path.join(root, f"train-{i:05d}-of-{num_files:05d}")
        with tf.io.TFRecordWriter(path) as writer:
            for j in range(per_file):
                writer.write(_example(_framed(*SHAPES[(i + j) % 5]), 1 + i))
        if garbage_after_first:
            with open(path, "rb") as f:
                first_len = int(np.frombuffer(f.read(8), "<u8")[0])
            with open(path, "r+b") as f:
                f.seek(8 + 4 + first_len + 4)
                f.truncate()
                f.write(b"\x00garbage, not a TFRecord frame" * 3)
    with tf.io.TFRecordWriter(os.path.join(root, "validation-0")) as writer:
        for j, shape in enumerate(SHAPES):
            writer.write(_example(_framed(*shape), 1 + j % num_files))
    return str(root)


def _load(root, **kwargs):
    return data.load("tfrecord", 32, data_dir=root, num_classes=4,
                     num_examples=kwargs.pop("num_examples", (20, 5)),
                     **kwargs)


def test_eval_is_the_central_crop_and_train_a_random_resized_crop(tmp_path):
    spec = _load(_shards(tmp_path / "d"))
    images = np.stack([x.numpy() for x, _ in spec.validation])
    assert images.shape == (5, 32, 32, 3)
    # The central 224/256 of the shorter side is all white, whatever the
    # aspect ratio: a plain resize would keep black borders.
    assert images.min() > 0.9 and images.max() <= 1.0
    train = [x.numpy() for x, _ in spec.train_for_epoch(0, 0)]
    assert len(train) == 20 and train[0].shape == (32, 32, 3)
    assert all(0.0 <= x.min() and x.max() <= 1.0 for x in train)
    # Crops reach the black borders of the wide and tall images.
    assert min(x.min() for x in train) < 0.1
    again = [x.numpy() for x, _ in spec.train_for_epoch(0, 0)]
    other = [x.numpy() for x, _ in spec.train_for_epoch(1, 0)]
    np.testing.assert_array_equal(np.stack(train), np.stack(again))
    assert not np.allclose(np.sum(train, axis=0), np.sum(other, axis=0))


def test_batches_are_normalized_per_channel(tmp_path):
    spec = _load(_shards(tmp_path / "d"))
    _, val = data.batch(spec, 5)
    x, _ = next(iter(val))
    white = (1.0 - np.array(imagenet.MEAN)) / np.array(imagenet.STD)
    np.testing.assert_allclose(x.numpy().reshape(-1, 3).max(0), white,
                               rtol=0.02)


def test_keras_imagenet_weights_get_caffe_preprocessing():
    caffe = imagenet.normalizer(
        "/w/resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5")
    x = tf.constant([[[0.2, 0.4, 0.6]]])
    expected = np.array([0.6, 0.4, 0.2]) * 255 - np.array(
        imagenet.CAFFE_MEAN_BGR)
    np.testing.assert_allclose(caffe(x).numpy()[0, 0], expected, rtol=1e-6)


def test_nothing_is_read_past_the_first_record_before_training(tmp_path):
    # Every train file is a valid first record followed by garbage: a scan
    # (counting records) or an up-front check of more would fail here.
    root = _shards(tmp_path / "d", garbage_after_first=True)
    spec = _load(root)
    assert (spec.num_train, spec.num_validation) == (20, 5)
    with pytest.raises(tf.errors.OpError):
        for _ in spec.train_for_epoch(0, 0):
            pass


def test_a_bad_file_is_named_when_it_is_opened(tmp_path):
    root = _shards(tmp_path / "d")
    bad = os.path.join(root, "train-00002-of-00004")
    with tf.io.TFRecordWriter(bad) as writer:
        writer.write(b"not an Example")
    spec = _load(root)  # The first file is fine: accepted up front.
    with pytest.raises(Exception, match="train-00002-of-00004"):
        for _ in spec.train_for_epoch(0, 0):
            pass


def test_counts_come_from_flags_then_the_index_then_imagenet(tmp_path):
    root = _shards(tmp_path / "d")
    assert imagenet.counts(root) == {"train": 1_281_167,
                                     "validation": 50_000}
    assert imagenet.main(["prog", root]) == 0
    with open(os.path.join(root, "index.json")) as f:
        assert sum(json.load(f)["train"].values()) == 20
    assert imagenet.counts(root) == {"train": 20, "validation": 5}
    assert imagenet.counts(root, 7, 0) == {"train": 7, "validation": 5}
    spec = _load(root, num_examples=(0, 0))
    assert (spec.num_train, spec.num_validation) == (20, 5)


def test_two_workers_read_disjoint_files_covering_the_data(tmp_path):
    from tensorflow.python.data.experimental.ops import distribute

    root = _shards(tmp_path / "d")
    records = imagenet.read(imagenet.files(root)["train"], 4)
    assert records.options().experimental_distribute.auto_shard_policy == (
        tf.data.experimental.AutoShardPolicy.FILE)
    seen = []
    for index in range(2):
        shard = distribute._AutoShardDataset(records, 2, index)
        labels = [int(imagenet.parse(r, 4)[1].numpy().argmax()) + 1
                  for r in shard]
        assert len(labels) == 10  # two whole files of five
        seen.append(set(labels))
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == {1, 2, 3, 4}


def test_the_command_trains_on_tfrecords_without_counting_them(
        small, tmp_path):
    from keras_largebatch.train.run import driver as train_main

    root = _shards(tmp_path / "d")
    model_dir = tmp_path / "run"
    assert train_main.main([
        "keras-largebatch-train", "--dataset=tfrecord", f"--data_dir={root}",
        "--num_classes=4", "--num_train_examples=20",
        "--num_validation_examples=5", "--global_batch_size=4",
        "--epochs=2", "--warmup_epochs=0", "--image_size=67", "--verbose=0",
        f"--model_dir={model_dir}"]) == 0
    summary = json.loads((model_dir / "summary.json").read_text())
    assert (summary["num_train"], summary["num_validation"]) == (20, 5)
    # Two epochs of 20 / 4 steps, less the first (it compiles).
    assert summary["images_timed"] == (2 * 5 - 1) * 4
