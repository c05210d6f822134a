"""Data augmentation in NumPy, for the Grain input pipeline (no TensorFlow).

The policies of `augment.py`, drawn and applied per batch on the host:

    light: a shift of up to 10% of each side, then a zoom of up to 10%
        about the centre, bilinear, zeros outside; no flip.
    crop_flip: a random crop of 87.5% of the side resized back (bilinear),
        then a horizontal flip with probability 1/2.

Every stage is an axis-aligned affine map of output pixel `(y, x)` to input
pixel `(sy * y + oy, sx * x + ox)`, sampled bilinearly one axis at a time.
Stage `i` of batch `step` of `epoch` draws from its own generator,
`SeedSequence([seed, epoch, step, i])`, so a batch is augmented the same
way in every run, whatever the reading threads do; parameters are drawn for
the whole global batch and each process applies its rows (`rows`).
"""

import numpy as np

from keras_largebatch.train.data.augment import stages


class NumpyAugmenter:
    """Stages `fn(images, rng, rows) -> images` applied in order.

    Args:
        stages: List of `(name, fn)`.
        seed: Int, the first word of every stage's seed.
    """

    def __init__(self, stages, seed=0):
        self.stages = list(stages)
        self.seed = seed

    def __call__(self, images, epoch, step, rows=None):
        """Augments `images` (float32, NHWC), rows `rows` of the batch.

        `rows`: the slice of the global batch these images are (default:
        all of it); the random draws cover `rows.stop` rows.
        """
        rows = rows or slice(0, len(images))
        for i, (_, fn) in enumerate(self.stages):
            rng = np.random.default_rng(
                np.random.SeedSequence([self.seed, epoch, step, i]))
            images = fn(images, rng, rows)
        return images


def build(policy, seed=0):
    """Returns a `NumpyAugmenter` for `policy` (see module doc), or None."""
    found = stages(policy, {"translate": _translate, "zoom": _zoom,
                            "crop": _crop, "flip": lambda _: _flip})
    return None if found is None else NumpyAugmenter(found, seed)


def _uniform(rng, rows, low, high, width=1):
    return rng.uniform(low, high, (rows.stop, width))[rows].astype("float32")


def _sample_axis(images, axis, scale, offset):
    """Bilinear resampling of `images` along `axis` (1: rows, 2: columns):
    output `i` of image `n` reads input `scale[n] * i + offset[n]`, zero
    outside the image."""
    n, size = images.shape[0], images.shape[axis]
    coord = scale[:, None] * np.arange(size, dtype="float32") + offset[:, None]
    low = np.floor(coord)
    frac = coord - low
    low = low.astype("int64")
    out = 0.0
    for index, weight in ((low, 1.0 - frac), (low + 1, frac)):
        inside = (index >= 0) & (index < size)
        weight = np.where(inside, weight, 0.0).astype("float32")
        index = np.clip(index, 0, size - 1)
        batch = np.arange(n)[:, None]
        if axis == 1:
            taken = images[batch, index]
            out = out + taken * weight[:, :, None, None]
        else:
            taken = images[batch, :, index].transpose(0, 2, 1, 3)
            out = out + taken * weight[:, None, :, None]
    return out.astype("float32")


def _affine(images, sy, oy, sx, ox):
    return _sample_axis(_sample_axis(images, 1, sy, oy), 2, sx, ox)


def _translate(fraction):
    def fn(images, rng, rows):
        shift = _uniform(rng, rows, -fraction, fraction, 2) * np.array(
            images.shape[1:3], "float32")
        one = np.ones(len(images), "float32")
        return _affine(images, one, -shift[:, 0], one, -shift[:, 1])

    return fn


def _zoom(fraction):
    def fn(images, rng, rows):
        z = _uniform(rng, rows, 1.0 - fraction, 1.0 + fraction)[:, 0]
        cy = (images.shape[1] - 1) / 2
        cx = (images.shape[2] - 1) / 2
        return _affine(images, z, (1 - z) * cy, z, (1 - z) * cx)

    return fn


def _crop(fraction):
    def fn(images, rng, rows):
        corner = _uniform(rng, rows, 0.0, 1.0 - fraction, 2)
        h, w = images.shape[1] - 1, images.shape[2] - 1
        f = np.full(len(images), fraction, "float32")
        return _affine(images, f, corner[:, 0] * h, f, corner[:, 1] * w)

    return fn


def _flip(images, rng, rows):
    flip = _uniform(rng, rows, 0.0, 1.0)[:, 0] < 0.5
    return np.where(flip[:, None, None, None], images[:, :, ::-1], images)


def resize_matrix(size_in, size_out):
    """`(size_out, size_in)` bilinear weights with half-pixel centres, as
    `tf.image.resize(..., "bilinear")` (no antialiasing) computes them."""
    coord = (np.arange(size_out) + 0.5) * size_in / size_out - 0.5
    coord = np.clip(coord, 0, size_in - 1)
    low = np.floor(coord).astype("int64")
    high = np.minimum(low + 1, size_in - 1)
    frac = coord - low
    matrix = np.zeros((size_out, size_in), "float32")
    np.add.at(matrix, (np.arange(size_out), low), 1.0 - frac)
    np.add.at(matrix, (np.arange(size_out), high), frac)
    return matrix


def resize(images, size, channels):
    """Bilinear resize of NHWC `images` to `size` x `size`, then grey to
    `channels` (1 -> 3 repeats)."""
    h, w = images.shape[1:3]
    if (h, w) != (size, size):
        images = np.einsum("ih,nhwc,jw->nijc", resize_matrix(h, size),
                           images, resize_matrix(w, size), optimize=True)
    if images.shape[-1] == 1 and channels == 3:
        images = np.repeat(images, 3, axis=-1)
    return images.astype("float32", copy=False)
