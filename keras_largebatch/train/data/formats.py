"""File formats, without TensorFlow: LeCun's IDX, image files, class folders.
"""

import gzip
import os

import numpy as np

from keras_largebatch.train.data.spec import DataError

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def read_idx(path):
    """Reads one IDX file (gzipped or not) into a uint8 NumPy array.

    The format of LeCun's MNIST files: two zero bytes, a type code (0x08 for
    unsigned bytes), the number of dimensions, each dimension as a big-endian
    int32, then the data.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"Cannot read IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[0] or raw[1] or raw[2] != 0x08 or not raw[3]:
        raise DataError(
            f"{path} is not an IDX file of unsigned bytes (header "
            f"{raw[:4].hex() or 'empty'}, expected 0000 08 <ndim>)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(np.frombuffer(raw[4:header], ">i4").tolist())
    if len(shape) != ndim or len(raw) - header != int(np.prod(shape)):
        raise DataError(
            f"{path}: the IDX header gives shape {shape}, which does not "
            f"match the {max(len(raw) - header, 0)} bytes of data")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def decode_image(path, image_size=None):
    """An image file as float32 RGB in [0, 1] (Pillow; the first frame of
    an animation), resized bilinearly to `image_size` if given."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        if image_size and image.size != (image_size, image_size):
            image = image.resize((image_size, image_size),
                                 Image.Resampling.BILINEAR)
        return np.asarray(image, "float32") / 255.0


def existing_dir(data_dir):
    """`data_dir`, if it is a folder; else `DataError`."""
    if not data_dir:
        raise DataError(
            "`data_dir` is required for this data set. Received: "
            f"data_dir={data_dir!r}"
        )
    if not os.path.isdir(data_dir):
        raise DataError(
            f"`data_dir` does not exist or is not a directory. Received: "
            f"data_dir={data_dir!r}"
        )
    return data_dir


def class_folders(folder, check_images):
    """Returns (classes, image paths, labels) of one split's folder: one
    subfolder per class, sorted; with `check_images`, every image decoded
    once."""
    classes = sorted(
        d for d in os.listdir(folder)
        if os.path.isdir(os.path.join(folder, d))
    )
    if not classes:
        raise DataError(
            f"`data_dir` must hold one subfolder per class; none in "
            f"{folder!r}. Received: data_dir={folder!r}"
        )
    paths, labels = [], []
    for label, name in enumerate(classes):
        class_dir = os.path.join(folder, name)
        for file in sorted(os.listdir(class_dir)):
            if file.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(os.path.join(class_dir, file))
                labels.append(label)
    if check_images:
        for path in paths:
            try:
                decode_image(path)
            except Exception:
                raise DataError(
                    f"Image file does not decode (corrupt or not an "
                    f"image): {path}. Received: data_dir={folder!r}"
                ) from None
    return classes, paths, np.asarray(labels, "int64")
