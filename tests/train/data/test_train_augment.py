"""Augmentation policies (stateless TensorFlow ops inside tf.data)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
# tf.data's ops, whatever the Keras backend: the same on every backend.
pytestmark = [pytest.mark.tensorflow, pytest.mark.backend_independent]

from keras_largebatch.train.data import augment  # noqa: E402
from keras_largebatch.train.data import registry  # noqa: E402


def test_auto_policy_never_flips_digits():
    assert registry.augment_policy("auto", "digits") == "light"
    assert registry.augment_policy("auto", "directory") == "crop_flip"
    assert registry.augment_policy("none", "directory") == "none"
    assert augment.build("none", 8) is None


def _images(n=8, size=16):
    return np.random.default_rng(0).random((n, size, size, 3), "float32")


@pytest.mark.parametrize("policy", ["light", "crop_flip"])
def test_policy_keeps_shape_and_changes_images_inside_tf_data(policy):
    images = _images()
    layer = augment.build(policy, 16, seed=1)
    ds = tf.data.Dataset.from_tensor_slices(images).batch(8).map(
        lambda x: layer(x, seed=tf.constant([1, 2], "int64")),
        num_parallel_calls=4)
    out = next(iter(ds)).numpy()
    assert out.shape == images.shape
    assert not np.allclose(out, images)
    assert layer(images, training=False) is images


@pytest.mark.parametrize("policy", ["light", "crop_flip"])
def test_same_batch_seed_same_images_other_seed_other_images(policy):
    layer = augment.build(policy, 16)
    images = _images()
    a = layer(images, seed=tf.constant([5, 9], "int64")).numpy()
    b = layer(images, seed=tf.constant([5, 9], "int64")).numpy()
    c = layer(images, seed=tf.constant([5, 10], "int64")).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_each_stage_draws_from_its_own_seed():
    seen = []

    def record(images, seed):
        seen.append(tf.random.stateless_uniform((4,), seed).numpy())
        return images

    augmenter = augment.Augmenter([("a", record), ("b", record)])
    augmenter(_images(), seed=tf.constant([3, 4], "int64"))
    assert not np.allclose(seen[0], seen[1])


def test_flip_mirrors_about_half_the_images():
    images = _images(n=64)
    out = augment._flip(images, tf.constant([0, 1], "int64")).numpy()
    flipped = [np.array_equal(o, i[:, ::-1]) for o, i in zip(out, images)]
    kept = [np.array_equal(o, i) for o, i in zip(out, images)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert 16 <= sum(flipped) <= 48


def test_translation_moves_the_content_by_the_drawn_shift():
    image = np.zeros((1, 20, 20, 1), "float32")
    image[0, 8:12, 8:12] = 1.0
    out = augment._translate(0.1)(image, tf.constant([0, 7], "int64"))
    shift = tf.random.stateless_uniform((1, 2), tf.constant([0, 7], "int64"),
                                        -0.1, 0.1).numpy()[0] * 20
    ys, xs = np.nonzero(out.numpy()[0, ..., 0] > 0.5)
    np.testing.assert_allclose([ys.mean(), xs.mean()],
                               [9.5 + shift[0], 9.5 + shift[1]], atol=0.6)


def test_unknown_policy_names_the_argument():
    with pytest.raises(ValueError, match="augment"):
        augment.build("mixup", 16)
