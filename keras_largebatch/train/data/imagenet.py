"""ImageNet-format TFRecords at scale: no scan, lazy checks, sharded reads.

Files `train-*` and `validation-*` (the TF models garden's conversion):
features `image/encoded` (JPEG bytes) and `image/class/label` (int64,
1-based). Nothing is read before training but the first record of the
first file of each split (checked up front, so a wrong folder fails at
once); every other file's first record is checked as the file is opened,
and an error names the file.

The example counts (for steps per epoch and the learning-rate schedule)
come, in order, from `--num_train_examples`/`--num_validation_examples`,
from `index.json` in the folder (written once by
`python -m keras_largebatch.train.data.imagenet DATA_DIR`, a full scan), or
are ImageNet's: 1,281,167 and 50,000.

Training images: a random-resized crop (area 8%-100% of the image, aspect
3/4-4/3, Szegedy et al., arXiv:1409.4842) decoded with
`tf.io.decode_and_crop_jpeg` (only the crop's blocks are decoded),
resized to the input size, flipped with probability 1/2. Evaluation: the
central crop of 224/256 of the shorter side, resized. Values are in
[0, 1]; `normalizer` gives the model's normalization (per-channel, or
Keras' caffe `preprocess_input` for its ImageNet ResNet-50 weights).
Files are read with a deterministic parallel interleave; under a
multi-worker strategy each worker reads its own files
(`AutoShardPolicy.FILE`).
"""

import glob
import json
import os
import sys

from keras_largebatch._shared import atomic_write

IMAGENET_COUNTS = {"train": 1_281_167, "validation": 50_000}
INDEX = "index.json"
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)
KERAS_IMAGENET_WEIGHTS = "resnet50_weights_tf_dim_ordering_tf_kernels"


def files(data_dir):
    """{"train": [...], "validation": [...]} (sorted)."""
    return {split: sorted(glob.glob(os.path.join(data_dir, f"{split}-*")))
            for split in ("train", "validation")}


def counts(data_dir, num_train=0, num_validation=0):
    """Example counts: flags, else `index.json`, else ImageNet's."""
    index = {}
    path = os.path.join(data_dir, INDEX)
    if os.path.exists(path):
        with open(path) as f:
            index = {split: sum(per_file.values())
                     for split, per_file in json.load(f).items()}
    given = {"train": num_train, "validation": num_validation}
    return {split: given[split] or index.get(split)
            or IMAGENET_COUNTS[split] for split in given}


def write_index(data_dir):
    """Counts every record once; writes `data_dir/index.json`."""
    import tensorflow as tf

    index = {split: {os.path.basename(p): sum(
        1 for _ in tf.data.TFRecordDataset(p)) for p in paths}
        for split, paths in files(data_dir).items()}
    atomic_write(os.path.join(data_dir, INDEX),
                 json.dumps(index, indent=1, sort_keys=True))
    return index


def _features():
    import tensorflow as tf

    return {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}


def check_record(record, path, num_classes):
    """Parses one record eagerly; raises ValueError naming `path`."""
    import tensorflow as tf

    try:
        example = tf.io.parse_single_example(record, _features())
        label = int(example["image/class/label"])
        tf.io.extract_jpeg_shape(example["image/encoded"])
    except Exception as e:
        raise ValueError(
            f"{path} is not an ImageNet-format TFRecord (image/encoded "
            f"JPEG, image/class/label): {str(e).splitlines()[0][:200]}"
        ) from None
    if not 1 <= label <= num_classes:
        raise ValueError(
            f"`image/class/label` must be 1-based in [1, {num_classes}]; "
            f"{path} holds {label}. Set --num_classes. "
            f"Received: num_classes={num_classes}")


def _checked_file(path, num_classes):
    """A file's records; its first is checked when the file is opened."""
    import tensorflow as tf

    def check(record, name):
        check_record(record, name.numpy().decode(), num_classes)
        return record

    first = tf.data.TFRecordDataset(path).take(1).map(
        lambda record: tf.ensure_shape(
            tf.py_function(check, [record, path], tf.string), []))
    return first.concatenate(tf.data.TFRecordDataset(path).skip(1))


def read(paths, num_classes, shuffle_seed=None):
    """Records of `paths` via a deterministic parallel interleave.

    With `shuffle_seed`, the file order is shuffled with it first. The
    file list is the source that `AutoShardPolicy.FILE` splits.
    """
    import tensorflow as tf

    names = tf.data.Dataset.from_tensor_slices(paths)
    if shuffle_seed is not None:
        names = names.shuffle(len(paths), seed=shuffle_seed,
                              reshuffle_each_iteration=False)
    records = names.interleave(
        lambda p: _checked_file(p, num_classes),
        cycle_length=min(len(paths), 16), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.FILE)
    return records.with_options(options)


def parse(record, num_classes):
    import tensorflow as tf

    example = tf.io.parse_single_example(record, _features())
    label = tf.one_hot(example["image/class/label"] - 1, num_classes)
    return example["image/encoded"], label


def decode_train(encoded, size, seed):
    """Random-resized crop (8-100% area, aspect 3/4-4/3) and flip."""
    import tensorflow as tf

    fold = tf.random.experimental.stateless_fold_in
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=fold(seed, 0), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
    image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
    image = tf.image.resize(image, (size, size)) / 255.0
    image = tf.image.stateless_random_flip_left_right(image, fold(seed, 1))
    return tf.clip_by_value(image, 0.0, 1.0)


def decode_eval(encoded, size):
    """Central crop of 224/256 of the shorter side, resized to `size`."""
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(encoded)
    side = tf.cast(tf.cast(tf.minimum(shape[0], shape[1]), "float32")
                   * (224 / 256), "int32")
    top, left = (shape[0] - side) // 2, (shape[1] - side) // 2
    image = tf.io.decode_and_crop_jpeg(
        encoded, tf.stack([top, left, side, side]), channels=3)
    image = tf.image.resize(image, (size, size)) / 255.0
    return tf.clip_by_value(image, 0.0, 1.0)


def normalizer(init_weights=None):
    """`fn(x in [0, 1]) -> model input`: per-channel, or Keras' caffe."""
    import tensorflow as tf

    if init_weights and KERAS_IMAGENET_WEIGHTS in os.path.basename(
            init_weights):
        # keras.applications.resnet50.preprocess_input (caffe): BGR, 0-255,
        # minus the mean pixel; in TensorFlow ops, as it runs in tf.data.
        mean = tf.constant(CAFFE_MEAN_BGR)
        return lambda x: tf.reverse(x * 255.0, axis=[-1]) - mean
    mean, std = tf.constant(MEAN), tf.constant(STD)
    return lambda x: (x - mean) / std


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print("usage: python -m keras_largebatch.train.data.imagenet DATA_DIR",
              file=sys.stderr)
        return 2
    index = write_index(argv[1])
    print({split: sum(c.values()) for split, c in index.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
