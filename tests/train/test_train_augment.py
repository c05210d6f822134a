"""Augmentation policies (Keras 3 preprocessing layers inside tf.data)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_largebatch.train import augment  # noqa: E402


def test_auto_policy_never_flips_digits():
    assert augment.policy_for("auto", "digits") == "light"
    assert augment.policy_for("auto", "directory") == "crop_flip"
    assert augment.policy_for("none", "directory") == "none"
    assert augment.build("none", 8) is None


@pytest.mark.parametrize("policy", ["light", "crop_flip"])
def test_policy_keeps_shape_and_changes_images_inside_tf_data(policy):
    rng = np.random.default_rng(0)
    images = rng.random((4, 16, 16, 3), "float32")
    layer = augment.build(policy, 16, seed=1)
    ds = tf.data.Dataset.from_tensor_slices(images).batch(4).map(
        lambda x: layer(x, training=True))
    out = next(iter(ds)).numpy()
    assert out.shape == images.shape
    assert not np.allclose(out, images)


def test_unknown_policy_names_the_argument():
    with pytest.raises(ValueError, match="augment"):
        augment.build("mixup", 16)
