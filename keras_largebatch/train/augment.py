"""Data augmentation with Keras 3's own preprocessing layers.

The layers run inside `tf.data` under every backend (Keras switches them to
TensorFlow ops there), so augmentation costs no accelerator time. The design
card's "tf-keras-cv" is not a PyPI package, and keras-cv (last release
0.9.0, 2024) was superseded by these core layers and keras-hub.

Policies:
    light: a shift of up to 10% and a zoom of up to 10%, no flip (digits are
        not mirror-symmetric).
    crop_flip: pad-free random crop of 87.5% of the side, resized back, and a
        horizontal flip: the usual ImageNet recipe at small cost.
"""

import keras

POLICIES = ("none", "light", "crop_flip")


def policy_for(augment, dataset):
    """Resolves `--augment=auto` for a data set."""
    if augment != "auto":
        return augment
    return "light" if dataset in ("digits", "mnist", "fashion_mnist") \
        else "crop_flip"


def build(policy, image_size, seed=0):
    """Returns a `keras.layers.Pipeline` for batched images, or None."""
    if policy == "none":
        return None
    if policy == "light":
        layers = [
            keras.layers.RandomTranslation(0.1, 0.1, fill_mode="constant",
                                           seed=seed),
            keras.layers.RandomZoom(0.1, fill_mode="constant", seed=seed),
        ]
    elif policy == "crop_flip":
        crop = max(1, int(round(image_size * 0.875)))
        layers = [
            keras.layers.RandomCrop(crop, crop, seed=seed),
            keras.layers.Resizing(image_size, image_size),
            keras.layers.RandomFlip("horizontal", seed=seed),
        ]
    else:
        raise ValueError(
            f"`augment` must be one of auto, {', '.join(POLICIES)}. "
            f"Received: augment={policy!r}"
        )
    return keras.layers.Pipeline(layers)
