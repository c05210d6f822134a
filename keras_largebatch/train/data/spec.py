"""What every loader returns: a checked `DataSpec`, or a `DataError`."""

import dataclasses
import functools

import numpy as np


class DataError(ValueError):
    """Bad data input (the command reports it on one line, exit code 2)."""


@dataclasses.dataclass(frozen=True)
class RawImages:
    """The images as the data set gives them, which the saved model takes
    (`outputs/exported.py`): `shape` (height, width, channels; None where sizes
    vary) and `max_value`, the value that is white (16 for digits, 255
    for 8-bit images, 1 for synthetic ones)."""

    shape: tuple
    max_value: float


@dataclasses.dataclass
class DataSpec:
    """A data set, checked; its pipelines are built by
    `tf_pipeline.batch` (tf.data) or `grain_pipeline.batch` (Grain, no
    TensorFlow).

    In-memory data sets hold `arrays` (x_train, y_train, x_val, y_val:
    float32 images in [0, 1] at their own size, integer labels), class
    folders hold `files` (train paths, train labels, validation paths,
    validation labels); `train` and `validation` are their unbatched
    `tf.data` pipelines of `(image, one_hot_label)` at `image_size` with
    `channels`, built on first use.
    """

    name: str
    num_classes: int
    num_train: int
    num_validation: int
    channels: int = 3
    image_size: int = 0
    arrays: tuple = None
    files: tuple = None
    # () -> (train, validation) unbatched tf.data pipelines (built by the
    # loader, so that this module imports no pipeline).
    tf_pipelines: object = None
    # (epoch, data_pass) -> the training examples of that pass, for data
    # whose decoding is random (ImageNet's crops); else `train` is used.
    train_for_epoch: object = None
    # x in [0, 1] -> model input; None: (x - 0.5) * 2.
    normalize: object = None
    # What the saved model takes (`RawImages`); None: the model's input.
    raw: RawImages = None

    @functools.cached_property
    def _pipelines(self):
        return self.tf_pipelines()

    @property
    def train(self):
        return self._pipelines[0]

    @property
    def validation(self):
        return self._pipelines[1]


def require_tensorflow(what):
    """Raises `DataError` naming the install when TensorFlow is missing."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        raise DataError(
            f"{what} needs TensorFlow, which is not installed: `pip install "
            f"tensorflow-cpu` (or `keras-largebatch[tensorflow]`)") from None


def epoch_seed(seed, epoch, data_pass):
    """The shuffle seed (a Python int) of pass `data_pass` of `epoch`, the
    same in both pipelines."""
    words = np.random.SeedSequence([seed, epoch, data_pass]).generate_state(2)
    return int(words[0]) << 31 | int(words[1]) >> 1
