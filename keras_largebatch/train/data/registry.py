"""The data sets of `--dataset`: one table, everything else read from it.

`DATASETS` has one `Dataset` per data set: its loader, its own image size,
what `--augment=auto` means for it, the input pipelines that read it, what
it needs installed and its line in the flag's help. From it come
`--dataset`'s choices and help (`config/choices.py`), the input size of
`resnet_cifar` (`recipe.models.image_size_for`), the augmentation
(`Dataset.augment_for`), the pipeline of `--input_pipeline=auto`
(`Dataset.pipeline_for`), the error for an unknown name (`get`) and the
table in docs/training.md (`markdown`). Adding a data set is one entry here
and its loader in `loaders.py`:

    Dataset("kmnist", lambda r: loaders.load_kmnist(r.image_size, r.channels),
            native_size=28, augment="light", needs="...", help="...")
"""

import dataclasses

from keras_largebatch.train.data import loaders
from keras_largebatch.train.data.spec import DataError

KERAS_DATASETS = "keras.datasets (download once)"


@dataclasses.dataclass(frozen=True)
class Request:
    """What `--dataset`'s loader is asked for (see `load`)."""

    image_size: int
    data_dir: str = None
    num_classes: int = 0
    seed: int = 0
    check_images: bool = True
    channels: int = 3
    num_examples: tuple = (0, 0)
    init_weights: str = None


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One data set of `--dataset`.

    Attributes:
        name: its `--dataset` value.
        load: `Request -> DataSpec`; raises `DataError`.
        help: its part of `--dataset`'s help (entries with the same help
            share one).
        native_size: the side of its own images (`resnet_cifar`'s default
            input), None where the images have no one size.
        augment: what `--augment=auto` resolves to (`augment.POLICIES`).
        pipelines: the `--input_pipeline`s that read it; `auto` takes
            tf_data on the TensorFlow backend or when grain is not one.
        needs: what must be installed beyond the package's dependencies,
            and how ('' for nothing).
    """

    name: str
    load: object
    help: str
    native_size: int = None
    augment: str = "crop_flip"
    pipelines: tuple = ("tf_data", "grain")
    needs: str = ""

    def augment_for(self, augment):
        """`--augment`, with `auto` resolved for this data set."""
        return self.augment if augment == "auto" else augment

    def pipeline_for(self, input_pipeline):
        """`--input_pipeline` resolved: `auto` is tf.data on the
        TensorFlow backend and where Grain cannot read this data set
        (TFRecords), Grain elsewhere."""
        if input_pipeline != "auto":
            return input_pipeline
        import keras  # Here: the flags read this table without Keras.

        if (keras.backend.backend() == "tensorflow"
                or "grain" not in self.pipelines):
            return "tf_data"
        return "grain"


def _keras_dataset(name):
    return Dataset(
        name, lambda r: loaders.load_keras_dataset(name, r.image_size,
                                                   r.channels),
        KERAS_DATASETS, native_size=28 if name == "mnist" else 32,
        augment="light" if name == "mnist" else "crop_flip",
        needs="network on first use (cached in ~/.keras/datasets)")


DATASETS = (
    Dataset("digits",
            lambda r: loaders.load_digits(r.image_size, r.seed, r.channels),
            "embedded (scikit-learn, no download)", native_size=8,
            augment="light"),
    Dataset("directory",
            lambda r: loaders.load_directory(r.data_dir, r.image_size,
                                             r.seed, r.check_images),
            "class subfolders under --data_dir (with train/ and validation/ "
            "or split 80/20)"),
    Dataset("tfrecord",
            lambda r: loaders.load_tfrecord(
                r.data_dir, r.image_size, r.num_classes or 1000, r.seed,
                r.num_examples, r.init_weights),
            "ImageNet-format train-*/validation-* files in --data_dir",
            # Cropped and flipped while decoding (imagenet.py).
            augment="none", pipelines=("tf_data",),
            needs="TensorFlow (`pip install tensorflow-cpu`)"),
    Dataset("synthetic",
            lambda r: loaders.load_synthetic(r.image_size,
                                             r.num_classes or 10, r.seed),
            "random images, for throughput"),
    _keras_dataset("mnist"),
    Dataset("fashion_mnist",
            lambda r: loaders.load_fashion_mnist(r.image_size, r.data_dir,
                                                 r.channels),
            "the IDX files in --data_dir, else Debian's "
            "dataset-fashion-mnist, else " + KERAS_DATASETS,
            native_size=28, augment="light",
            needs="`apt-get install dataset-fashion-mnist` (offline), else "
                  "network on first use"),
    _keras_dataset("cifar10"),
    _keras_dataset("cifar100"),
)
BY_NAME = {dataset.name: dataset for dataset in DATASETS}
NAMES = tuple(BY_NAME)


def get(name):
    """The `Dataset` called `name`; `DataError` naming the choices."""
    if name not in BY_NAME:
        raise DataError(f"`dataset` must be one of {', '.join(NAMES)}. "
                        f"Received: dataset={name!r}")
    return BY_NAME[name]


def load(dataset, image_size, data_dir=None, num_classes=0, seed=0,
         check_images=True, channels=3, num_examples=(0, 0),
         init_weights=None):
    """Builds the `DataSpec` for `--dataset`; raises `DataError`.

    `channels=3` repeats grayscale images to three channels (for models
    made for RGB); `None` keeps each data set's own channels.
    `num_classes` matters for `tfrecord` (default 1000) and `synthetic`
    (default 10); `num_examples` (train, validation) and `init_weights`
    for `tfrecord` only (see `imagenet.py`).
    """
    return get(dataset).load(Request(
        image_size, data_dir, num_classes, seed, check_images, channels,
        tuple(num_examples), init_weights))


def native_size(name):
    """The side of `name`'s own images, None where they have no one size
    (or for an unknown name: the flags report that)."""
    found = BY_NAME.get(name)
    return found.native_size if found else None


def augment_policy(augment, name):
    """`--augment`, with `auto` resolved for the data set `name`
    (`Dataset.augment_for`)."""
    return get(name).augment_for(augment)


def flag_help():
    """`--dataset`'s help: each entry's, entries with the same one
    together."""
    groups = {}
    for dataset in DATASETS:
        groups.setdefault(dataset.help, []).append(dataset.name)
    return "; ".join(f"{', '.join(names)}: {text}"
                     for text, names in groups.items()) + "."


def markdown():
    """The data-set table of docs/training.md."""
    rows = ["| `--dataset` | own size | `--augment=auto` | pipelines | "
            "needs |", "|---|---|---|---|---|"]
    for d in DATASETS:
        size = f"{d.native_size}x{d.native_size}" if d.native_size else "-"
        rows.append(f"| `{d.name}` | {size} | {d.augment} | "
                    f"{', '.join(d.pipelines)} | {d.needs or '-'} |")
    return "\n".join(rows) + "\n"
