"""The loaders of `--dataset`'s data sets, each into a checked `DataSpec`
(`registry.py` lists the data sets and calls them).

Embedded digits, Fashion-MNIST (IDX files), keras.datasets, class folders
and synthetic images need no TensorFlow; TFRecords do (see `imagenet.py`).
Everything that can be checked is checked here, before the job writes
anything: a missing folder, no images, a file that does not decode, a
TFRecord without ImageNet's features.
"""

import functools
import os

import numpy as np

from keras_largebatch.train.data import tf_pipeline
from keras_largebatch.train.data.formats import class_folders
from keras_largebatch.train.data.formats import existing_dir
from keras_largebatch.train.data.formats import read_idx
from keras_largebatch.train.data.spec import DataError
from keras_largebatch.train.data.spec import DataSpec
from keras_largebatch.train.data.spec import RawImages
from keras_largebatch.train.data.spec import epoch_seed
from keras_largebatch.train.data.spec import require_tensorflow

# Where Fashion-MNIST's four IDX files are looked for, in order: Debian's
# `dataset-fashion-mnist` package, then Keras' download cache.
FASHION_MNIST_DIRS = (
    "/usr/share/datasets/fashion-mnist",
    os.path.join("~", ".keras", "datasets", "fashion-mnist"),
)
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
)


def load_digits(image_size, seed=0, channels=3):
    """scikit-learn's digits: 1,797 real 8x8 scans, 80/20 stratified split.

    The images ship inside the scikit-learn wheel, so this needs no network.
    They are upsampled (bilinear) to `image_size` and repeated to 3 channels.
    """
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    digits = sk_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    x_train, x_val, y_train, y_val = train_test_split(
        x, digits.target, test_size=0.2, stratify=digits.target,
        random_state=seed,
    )
    return from_arrays("digits", x_train, y_train, x_val, y_val, 10,
                       image_size, channels, raw_max=16.0)


def find_fashion_mnist(data_dir=None):
    """The folder holding Fashion-MNIST's four IDX files, or None."""
    dirs = (data_dir,) if data_dir else FASHION_MNIST_DIRS
    for d in dirs:
        d = os.path.expanduser(d)
        if all(os.path.isfile(os.path.join(d, f))
               for f in FASHION_MNIST_FILES):
            return d
    return None


def load_fashion_mnist_arrays(data_dir=None):
    """`(x_train, y_train), (x_test, y_test)` of Fashion-MNIST, uint8.

    Offline first: the IDX files of Debian's `dataset-fashion-mnist`
    (`/usr/share/datasets/fashion-mnist`), then Keras' cache
    (`~/.keras/datasets/fashion-mnist`), then `keras.datasets.fashion_mnist`
    (downloads). With `data_dir`, only that folder is read. The published
    split: 60,000 training and 10,000 test images of 28x28, 10 classes.
    """
    folder = find_fashion_mnist(data_dir)
    if folder is not None:
        arrays = [read_idx(os.path.join(folder, f))
                  for f in FASHION_MNIST_FILES]
        for images, labels, f in ((arrays[0], arrays[1], "train"),
                                  (arrays[2], arrays[3], "t10k")):
            if images.ndim != 3 or labels.ndim != 1 or (
                    len(images) != len(labels)):
                raise DataError(
                    f"Fashion-MNIST {f} files in {folder} disagree: images "
                    f"{images.shape}, labels {labels.shape}")
        return (arrays[0], arrays[1]), (arrays[2], arrays[3])
    if data_dir:
        raise DataError(
            f"`data_dir` must hold Fashion-MNIST's IDX files "
            f"({', '.join(FASHION_MNIST_FILES)}). Received: "
            f"data_dir={data_dir!r}")
    import keras

    try:
        return keras.datasets.fashion_mnist.load_data()
    except Exception as e:
        places = ", ".join(FASHION_MNIST_DIRS)
        raise DataError(
            f"Fashion-MNIST not found in {places}, and "
            f"keras.datasets.fashion_mnist could not download it "
            f"({type(e).__name__}). Install it offline with `apt-get install "
            f"dataset-fashion-mnist` or pass --data_dir. "
            f"Received: dataset='fashion_mnist'") from None


def load_fashion_mnist(image_size, data_dir=None, channels=3):
    """Fashion-MNIST (Xiao et al. 2017, arXiv:1708.07747), one channel.

    See `load_fashion_mnist_arrays` for where the files come from.
    """
    (x_train, y_train), (x_val, y_val) = load_fashion_mnist_arrays(data_dir)
    return from_arrays(
        "fashion_mnist", x_train[..., None].astype("float32") / 255.0,
        y_train, x_val[..., None].astype("float32") / 255.0, y_val, 10,
        image_size, channels)


def load_keras_dataset(name, image_size, channels=3):
    """`keras.datasets.<name>.load_data()` (downloads once to ~/.keras)."""
    import keras

    try:
        (x_train, y_train), (x_val, y_val) = getattr(
            keras.datasets, name
        ).load_data()
    except Exception as e:  # Offline or a broken cache.
        raise DataError(
            f"Could not load keras.datasets.{name} (it downloads once to "
            f"~/.keras/datasets): {type(e).__name__}: {e}. "
            f"Received: dataset={name!r}"
        ) from None
    if x_train.ndim == 3:
        x_train, x_val = x_train[..., None], x_val[..., None]
    num_classes = int(max(y_train.max(), y_val.max())) + 1
    return from_arrays(
        name, x_train.astype("float32") / 255.0, y_train.reshape(-1),
        x_val.astype("float32") / 255.0, y_val.reshape(-1), num_classes,
        image_size, channels,
    )


def load_synthetic(image_size, num_classes, seed=0, num_examples=512):
    """Random images and labels: only for throughput.

    A pool of `num_examples`; use `--steps_per_epoch` for longer epochs.
    """
    rng = np.random.default_rng(seed)
    x = rng.random((num_examples, image_size, image_size, 3), "float32")
    y = rng.integers(0, num_classes, num_examples)
    n_val = num_examples // 8
    return from_arrays("synthetic", x[n_val:], y[n_val:], x[:n_val],
                       y[:n_val], num_classes, image_size, raw_max=1.0)


def from_arrays(name, x_train, y_train, x_val, y_val, num_classes,
                image_size, channels=3, raw_max=255.0):
    """The `DataSpec` of in-memory arrays (images in [0, 1], integer
    labels); `channels` None keeps the images' own. The data set gives
    them in [0, `raw_max`] (`DataSpec.raw`)."""
    native = x_train.shape[-1]
    arrays = (x_train, np.asarray(y_train, "int64"), x_val,
              np.asarray(y_val, "int64"))
    return DataSpec(name, num_classes, len(x_train), len(x_val),
                    channels or native, image_size, arrays=arrays,
                    tf_pipelines=functools.partial(
                        tf_pipeline.from_arrays, arrays, num_classes,
                        image_size, channels or native),
                    raw=RawImages(tuple(x_train.shape[1:]), raw_max))


def load_directory(data_dir, image_size, seed=0, check_images=True):
    """A folder of class subfolders.

    With `train/` and `validation/` (or `val/`) inside, those are used;
    otherwise the folder is split 80/20 (files shuffled with `seed`, as
    `keras.utils.image_dataset_from_directory` splits). Labels follow the
    sorted class folders. The tf.data pipelines are Keras'
    `image_dataset_from_directory`; the Grain pipeline decodes the same
    files with Pillow.
    """
    root = existing_dir(data_dir)
    split = None
    for val_name in ("validation", "val"):
        train_dir = os.path.join(root, "train")
        val_dir = os.path.join(root, val_name)
        if os.path.isdir(train_dir) and os.path.isdir(val_dir):
            split = (train_dir, val_dir)
    classes, files = _list_directory(root, split, seed, check_images)
    if not files[0] or not files[2]:
        raise DataError(
            f"`data_dir` needs images for both training and validation "
            f"(found {len(files[0])} and {len(files[2])}). Received: "
            f"data_dir={data_dir!r}"
        )

    def tf_pipelines():
        import keras

        kwargs = dict(label_mode="categorical", image_size=(image_size,) * 2,
                      batch_size=None, seed=seed, verbose=False)
        if split:
            train = keras.utils.image_dataset_from_directory(
                split[0], **kwargs)
            val = keras.utils.image_dataset_from_directory(
                split[1], shuffle=False, **kwargs)
        else:
            train, val = keras.utils.image_dataset_from_directory(
                root, validation_split=0.2, subset="both", **kwargs)
        scale = lambda x, y: (x / 255.0, y)  # noqa: E731
        return train.map(scale), val.map(scale)

    return DataSpec("directory", len(classes), len(files[0]), len(files[2]),
                    3, image_size, files=files, tf_pipelines=tf_pipelines,
                    raw=RawImages((None, None, 3), 255.0))


def _list_directory(root, split, seed, check_images):
    """(classes, (train paths, train labels, validation paths, validation
    labels)) of the folder `root`, or of its (train, validation) `split`."""
    classes = None
    listed = []
    for folder in split or (root,):
        found, paths, labels = class_folders(folder, check_images)
        if classes is not None and found != classes:
            raise DataError(
                f"`data_dir` train/ and validation/ have different classes: "
                f"{classes} vs {found}. Received: data_dir={root!r}"
            )
        classes = found
        listed.append((paths, labels))
    if split:
        (train_paths, train_labels), (val_paths, val_labels) = listed
        return classes, (train_paths, train_labels, val_paths, val_labels)
    paths, labels = listed[0]
    order = np.random.RandomState(seed).permutation(len(paths))
    cut = len(paths) - int(0.2 * len(paths))
    return classes, ([paths[i] for i in order[:cut]], labels[order[:cut]],
                     [paths[i] for i in order[cut:]], labels[order[cut:]])


def load_tfrecord(data_dir, image_size, num_classes=1000, seed=0,
                  num_examples=(0, 0), init_weights=None):
    """ImageNet-format TFRecords as written by the TF models garden.

    Files `train-*` and `validation-*` in `data_dir`; features
    `image/encoded` (JPEG bytes) and `image/class/label` (int64, 1-based:
    1..num_classes, as in the garden's ImageNet conversion). Reads nothing
    but the first record of each split's first file here; see
    `imagenet.py` for the counts, the checks and the preprocessing.
    """
    root = existing_dir(data_dir)
    require_tensorflow("`dataset=tfrecord`")
    import tensorflow as tf

    from keras_largebatch.train.data import imagenet

    paths = _checked_tfrecords(root, num_classes)
    counts = imagenet.counts(root, *num_examples)

    def train_for_epoch(epoch, data_pass):
        key = epoch_seed(seed, epoch, data_pass)
        base = tf.constant([seed, 1], "int64")
        fold = tf.random.experimental.stateless_fold_in
        epoch_key = fold(base, key)

        def decode(i, record):
            encoded, label = imagenet.parse(record, num_classes)
            return imagenet.decode_train(encoded, image_size,
                                         fold(epoch_key, i)), label

        return imagenet.read(paths["train"], num_classes, key).enumerate(
        ).map(decode, num_parallel_calls=tf.data.AUTOTUNE)

    def decode_eval(record):
        encoded, label = imagenet.parse(record, num_classes)
        return imagenet.decode_eval(encoded, image_size), label

    val = imagenet.read(paths["validation"], num_classes).map(
        decode_eval, num_parallel_calls=tf.data.AUTOTUNE)
    return DataSpec("tfrecord", num_classes, counts["train"],
                    counts["validation"], 3, image_size,
                    tf_pipelines=lambda: (None, val),
                    train_for_epoch=train_for_epoch,
                    normalize=imagenet.normalizer(init_weights))


def _checked_tfrecords(data_dir, num_classes):
    """{split: files}, the first record of each split's first file
    checked."""
    import tensorflow as tf

    from keras_largebatch.train.data import imagenet

    paths = imagenet.files(data_dir)
    for split, found in paths.items():
        if not found:
            raise DataError(
                f"`data_dir` has no {split}-* TFRecord files. Received: "
                f"data_dir={data_dir!r}"
            )
        first = next(iter(tf.data.TFRecordDataset(found[:1])), None)
        try:
            if first is None:
                raise ValueError(f"{found[0]} is empty: not an "
                                 f"ImageNet-format TFRecord")
            imagenet.check_record(first, found[0], num_classes)
        except ValueError as e:
            raise DataError(f"{e} Received: data_dir={data_dir!r}") from None
    return paths
