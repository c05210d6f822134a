"""Data augmentation inside `tf.data`, random only through its seeds.

Each stage draws from its own stateless seed, `fold_in(batch_seed,
stage)`, and the command gives every batch the seed of `(seed, epoch,
step)` (`data.tf_pipeline.batch_seed`): the same batch is augmented the
same way in every run, on every backend, however `tf.data`'s threads are
scheduled.
(Keras' preprocessing layers draw from a `SeedGenerator` whose state the
parallel map threads advance in whatever order they run; and given one
seed, layers of the same kind draw the same numbers.)

Policies (`--augment=auto` is each data set's own, `data.registry`):
    light: a shift of up to 10% of each side, then a zoom of up to 10%,
        zeros outside; no flip (digits are not mirror-symmetric).
    crop_flip: a random crop of 87.5% of the side, resized back, then a
        horizontal flip with probability 1/2.
"""

from keras_largebatch._shared import require

POLICIES = ("none", "light", "crop_flip")
# Each policy's stages: (name, parameter), the same in `augment_numpy`.
STAGES = {
    "light": (("translate", 0.1), ("zoom", 0.1)),
    "crop_flip": (("crop", 0.875), ("flip", None)),
}


def stages(policy, makers):
    """`[(name, fn)]` of `policy` from `makers` {name: parameter -> fn};
    None for `none`."""
    require(policy in POLICIES, "augment", policy,
            f"one of auto, {', '.join(POLICIES)}")
    if policy == "none":
        return None
    return [(name, makers[name](parameter))
            for name, parameter in STAGES[policy]]


class Augmenter:
    """Stages `fn(images, seed) -> images` applied in order to a batch.

    Args:
        stages: List of `(name, fn)`; stage `i` gets the seed
            `fold_in(seed, i)` of the batch's seed.
        seed: Int, the default batch seed's first word (calls without
            `seed`).
    """

    def __init__(self, stages, seed=0):
        self.stages = list(stages)
        self.seed = seed

    def __call__(self, images, seed=None, training=True):
        import tensorflow as tf

        if not training:
            return images
        if seed is None:
            seed = tf.constant([self.seed, 0], "int64")
        for i, (_, fn) in enumerate(self.stages):
            images = fn(images, tf.random.experimental.stateless_fold_in(
                seed, i))
        return images


def build(policy, image_size, seed=0):
    """Returns an `Augmenter` for batched images, or None."""
    found = stages(policy, {"translate": _translate, "zoom": _zoom,
                            "crop": _crop, "flip": lambda _: _flip})
    return None if found is None else Augmenter(found, seed)


def _uniform(shape, seed, low, high):
    import tensorflow as tf

    return tf.random.stateless_uniform(shape, seed, low, high)


def _transform(images, transforms):
    # transforms[b] = [a0, a1, a2, b0, b1, b2, 0, 0]: output pixel (x, y)
    # samples input (a0 x + a1 y + a2, b0 x + b1 y + b2), bilinear.
    import tensorflow as tf

    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms,
        output_shape=tf.shape(images)[1:3], fill_value=0.0,
        interpolation="BILINEAR", fill_mode="CONSTANT")


def _translate(fraction):
    def fn(images, seed):
        import tensorflow as tf

        n = tf.shape(images)[0]
        size = tf.cast(tf.shape(images)[1:3], "float32")
        shift = _uniform((n, 2), seed, -fraction, fraction) * size
        one, zero = tf.ones((n,)), tf.zeros((n,))
        return _transform(images, tf.stack(
            [one, zero, -shift[:, 1], zero, one, -shift[:, 0], zero, zero],
            axis=1))

    return fn


def _zoom(fraction):
    def fn(images, seed):
        import tensorflow as tf

        n = tf.shape(images)[0]
        size = tf.cast(tf.shape(images)[1:3], "float32")
        z = _uniform((n,), seed, 1.0 - fraction, 1.0 + fraction)
        cy, cx = (size[0] - 1) / 2, (size[1] - 1) / 2
        zero = tf.zeros((n,))
        return _transform(images, tf.stack(
            [z, zero, (1 - z) * cx, zero, z, (1 - z) * cy, zero, zero],
            axis=1))

    return fn


def _crop(fraction):
    def fn(images, seed):
        import tensorflow as tf

        n = tf.shape(images)[0]
        corner = _uniform((n, 2), seed, 0.0, 1.0 - fraction)
        boxes = tf.concat([corner, corner + fraction], axis=1)
        return tf.image.crop_and_resize(
            images, boxes, tf.range(n), tf.shape(images)[1:3])

    return fn


def _flip(images, seed):
    import tensorflow as tf

    flip = _uniform((tf.shape(images)[0], 1, 1, 1), seed, 0.0, 1.0) < 0.5
    return tf.where(flip, tf.reverse(images, axis=[2]), images)
