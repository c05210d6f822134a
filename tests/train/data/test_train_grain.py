"""The Grain input pipeline and NumPy augmentation (no TensorFlow)."""

import inspect
import subprocess
import sys

import numpy as np
import pytest

from keras_largebatch.train.data import augment_numpy
from keras_largebatch.train import data
from keras_largebatch.train.data import grain_pipeline

# NumPy and Grain, before any backend: the same on every backend.
pytestmark = pytest.mark.backend_independent


def _spec(n=50, size=6, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, size, size, 1), "float32")
    y = np.arange(n) % classes
    return data.from_arrays("t", x, y, x[:10], y[:10], classes, size, 3)


def _train(spec, batch, **kwargs):
    train, _ = grain_pipeline.batch(spec, batch, seed=3, **kwargs)
    return [(x, y) for x, y in train]


def test_each_epoch_is_a_permutation_and_a_resumed_epoch_reads_the_same():
    spec = _spec()
    full = _train(spec, 16, epochs=3)
    assert [len(x) for x, _ in full] == [16, 16, 16, 2] * 3
    for epoch in range(3):
        labels = np.concatenate([y.argmax(1) for _, y in full[4 * epoch:
                                                             4 * epoch + 4]])
        # Every example once per epoch: the labels' counts are the data's.
        np.testing.assert_array_equal(np.bincount(labels, minlength=4),
                                      np.bincount(np.arange(50) % 4))
    resumed = _train(spec, 16, epochs=3, initial_epoch=2)
    for (a, _), (b, _) in zip(full[8:], resumed):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(full[0][0], full[4][0])
    other_seed, _ = grain_pipeline.batch(spec, 16, seed=4, epochs=1)
    assert not np.array_equal(next(iter(other_seed))[0], full[0][0])


def test_processes_read_disjoint_slices_that_tile_the_global_batch():
    spec = _spec()
    aug = augment_numpy.build("crop_flip", seed=1)
    kwargs = dict(augmenter=aug, drop_remainder=True, steps_per_epoch=5,
                  epochs=2)
    whole = _train(spec, 12, **kwargs)
    parts = [_train(spec, 12, process_index=p, process_count=3, **kwargs)
             for p in range(3)]
    assert len(whole) == 10
    for step, (x, y) in enumerate(whole):
        np.testing.assert_array_equal(
            np.concatenate([parts[p][step][0] for p in range(3)]), x)
        np.testing.assert_array_equal(
            np.concatenate([parts[p][step][1] for p in range(3)]), y)


def test_steps_beyond_a_pass_read_the_next_pass_reshuffled():
    spec = _spec(n=20)
    batches = _train(spec, 8, steps_per_epoch=5, epochs=1,
                     drop_remainder=True)
    labels = np.concatenate([y.argmax(1) for _, y in batches])
    assert len(labels) == 40  # two passes of 20
    np.testing.assert_array_equal(np.bincount(labels), [10, 10, 10, 10])


def test_images_are_resized_and_normalized_to_minus_one_one():
    spec = _spec(size=4)
    spec.image_size = 8
    x, y = _train(spec, 50, epochs=1)[0]
    assert x.shape == (50, 8, 8, 3) and y.shape == (50, 4)
    assert -1.0 <= x.min() and x.max() <= 1.0
    np.testing.assert_array_equal(x[..., 0], x[..., 2])


def test_resize_matches_half_pixel_bilinear_in_closed_form():
    # Upsampling 2 -> 4 with half-pixel centres: output i reads input
    # (i + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25, clamped to [0, 1].
    np.testing.assert_allclose(augment_numpy.resize_matrix(2, 4), [
        [1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    image = np.array([[0.0, 1.0], [2.0, 3.0]], "float32")[None, :, :, None]
    out = augment_numpy.resize(image, 4, 1)[0, :, :, 0]
    np.testing.assert_allclose(out[0], [0, 0.25, 0.75, 1.0])
    np.testing.assert_allclose(out[:, 0], [0, 0.5, 1.5, 2.0])


@pytest.mark.tensorflow
def test_resize_matches_tensorflow_bilinear():
    tf = pytest.importorskip("tensorflow")
    images = np.random.default_rng(0).random((3, 8, 8, 1), "float32")
    ours = augment_numpy.resize(images, 67, 1)
    theirs = tf.image.resize(images, (67, 67), "bilinear").numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_an_integer_shift_moves_pixels_and_fills_zeros():
    image = np.arange(1, 26, dtype="float32").reshape(1, 5, 5, 1)
    one = np.ones(1, "float32")
    shifted = augment_numpy._affine(image, one, np.array([-1.0], "float32"),
                                    one, np.array([2.0], "float32"))
    expected = np.zeros((5, 5), "float32")
    expected[1:, :3] = image[0, :4, 2:, 0]
    np.testing.assert_array_equal(shifted[0, :, :, 0], expected)


def test_crop_flip_stages_have_their_own_seeds_and_depend_on_the_step():
    images = np.random.default_rng(0).random((64, 16, 16, 3), "float32")
    aug = augment_numpy.build("crop_flip", seed=5)
    a = aug(images, epoch=0, step=0)
    np.testing.assert_array_equal(a, aug(images, epoch=0, step=0))
    assert not np.array_equal(a, aug(images, epoch=0, step=1))
    assert not np.array_equal(a, aug(images, epoch=1, step=0))
    # About half of the images are mirrored: crop alone, then compare.
    crop = augment_numpy.NumpyAugmenter(aug.stages[:1], seed=5)(
        images, epoch=0, step=0)
    mirrored = [np.allclose(a[i], crop[i, :, ::-1]) for i in range(64)]
    assert 16 < sum(mirrored) < 48
    # Crops of 87.5% resized back: the same image, slightly magnified.
    assert a.shape == images.shape and np.abs(a).max() <= 1.0


def test_class_folders_decode_with_pillow(tmp_path):
    from PIL import Image

    for name, value in (("a", 30), ("b", 200)):
        (tmp_path / name).mkdir()
        for i in range(5):
            Image.fromarray(np.full((9, 9, 3), value, "uint8")).save(
                tmp_path / name / f"{i}.png")
    spec = data.load("directory", image_size=4, data_dir=str(tmp_path))
    assert (spec.num_train, spec.num_validation) == (8, 2)
    x, y = _train(spec, 8, epochs=1)[0]
    expected = (np.array([30, 200])[y.argmax(1)] / 255.0 - 0.5) * 2
    np.testing.assert_allclose(x.mean(axis=(1, 2, 3)), expected, atol=1e-6)
    (tmp_path / "a" / "bad.png").write_bytes(b"not an image")
    with pytest.raises(data.DataError, match="bad.png"):
        data.load("directory", image_size=4, data_dir=str(tmp_path))


def _bare_python_without_jax(code):
    """stderr of `code` run in a bare Python (Grain alone, no Keras: under
    a second) where `import jax` fails, as on a torch-only install."""
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys\nsys.modules['jax'] = None\n" + code],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_grain_is_imported_without_its_jax_profiler_warning_where_no_jax():
    assert "Failed to load jax profiler" in _bare_python_without_jax(
        "import grain"), "Grain no longer warns: `_grain` may import it plainly"
    source = inspect.getsource(grain_pipeline._grain)
    err = _bare_python_without_jax(f"import logging\n{source}\n_grain()")
    assert "jax profiler" not in err, err
