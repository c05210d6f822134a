"""Every fused backend path equals the generic per-variable path.

The trust ratio is written twice: in `LARS.scaled_update` and
`LAMB.update_step` (the generic path), and again in `torch_lars`,
`torch_lamb` and, for a loss-scaled step, through `torch_mixed`'s folded
`1 / loss_scale` and squared norms (`tf_lars` takes `scaled_update` and
puts the momentum step in a kernel). Each fast path runs here with
`use_fused_path` on and off, over several steps at realistic magnitudes, on
a model with a zero-norm kernel (with a zero gradient at the first step),
biases and batch-norm variables (neither decayed nor adapted) and a kernel
excluded from adaptation by name. Each run also checks that the fast path
ran, so that the comparison cannot be of the generic path with itself.
"""

import functools
import importlib

import keras
import numpy as np
import pytest

import keras_largebatch as klb

SCALE = 2.0**12
RTOL = 1e-5  # of the update over all steps
STEPS = 4
ZERO_KERNEL = 4  # zero/kernel in `dense_bn_model().trainable_variables`
SHARED = {"weight_decay": 1e-2, "exclude_from_layer_adaptation": ["head"]}

# (backend, fast path module, optimizer, whether its gradients are scaled)
PATHS = {
    "torch_lars": ("torch", "torch_lars", functools.partial(
        klb.LARS, 0.1, momentum=0.9, eta=0.02, **SHARED), False),
    "torch_lars_nesterov": ("torch", "torch_lars", functools.partial(
        klb.LARS, 0.1, momentum=0.9, eta=0.02, nesterov=True, **SHARED),
        False),
    "torch_lars_no_momentum": ("torch", "torch_lars", functools.partial(
        klb.LARS, 0.1, momentum=0.0, eta=0.02, **SHARED), False),
    "torch_lamb": ("torch", "torch_lamb", functools.partial(
        klb.LAMB, 0.05, **SHARED), False),
    "torch_lamb_trust_clip": ("torch", "torch_lamb", functools.partial(
        klb.LAMB, 0.05, trust_clip=True, **SHARED), False),
    "torch_mixed_lars": ("torch", "torch_lars", functools.partial(
        klb.LARSMixed, 0.1, momentum=0.9, eta=0.02, initial_scale=SCALE,
        **SHARED), True),
    "torch_mixed_lamb": ("torch", "torch_lamb", functools.partial(
        klb.LAMBMixed, 0.05, initial_scale=SCALE, **SHARED), True),
    "tf_lars": ("tensorflow", "tf_lars", functools.partial(
        klb.LARS, 0.1, momentum=0.9, eta=0.02, **SHARED), False),
    "tf_lars_nesterov": ("tensorflow", "tf_lars", functools.partial(
        klb.LARS, 0.1, momentum=0.9, eta=0.02, nesterov=True, **SHARED),
        False),
    "tf_lars_no_momentum": ("tensorflow", "tf_lars", functools.partial(
        klb.LARS, 0.1, momentum=0.0, eta=0.02, **SHARED), False),
}


def realistic_grads(variables, scaled):
    """Magnitudes log-uniform in 1e-6..1e-2 with random signs; zero/kernel
    gets a zero gradient at the first step (|w| = |g| = 0 there). Scaled:
    times the loss scale, with an infinity at the third step (skipped)."""
    rng = np.random.default_rng(21)
    steps = []
    for step in range(STEPS):
        grads = [
            (10.0 ** rng.uniform(-6, -2, v.shape)
             * rng.choice([-1, 1], v.shape)).astype("float32")
            for v in variables
        ]
        if step == 0:
            grads[ZERO_KERNEL] = np.zeros_like(grads[ZERO_KERNEL])
        if scaled:
            grads = [g * np.float32(SCALE) for g in grads]
            if step == 2:
                grads[1][0] = np.inf
        steps.append(grads)
    return steps


def run(name, fused, monkeypatch, dense_bn_model):
    """The variables before and after `STEPS` steps of `PATHS[name]`, and
    how many times its fast path ran."""
    _, module_name, make, scaled = PATHS[name]
    module = importlib.import_module(
        f"keras_largebatch.optimizers.{module_name}")
    calls = []
    original = module.update_step
    monkeypatch.setattr(
        module, "update_step", lambda *a: calls.append(1) or original(*a))
    keras.utils.set_random_seed(7)
    variables = dense_bn_model().trainable_variables
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer = make()
    rule = optimizer.inner_optimizer if scaled else optimizer
    rule.use_fused_path = fused
    for grads in realistic_grads(variables, scaled):
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads],
                        variables)
    monkeypatch.undo()
    final = [keras.ops.convert_to_numpy(v) for v in variables]
    return initial, final, len(calls)


@pytest.mark.parametrize("name", list(PATHS))
def test_fused_path_equals_generic_path(name, monkeypatch, dense_bn_model):
    backend = PATHS[name][0]
    if keras.backend.backend() != backend:
        pytest.skip(f"a {backend} path")
    initial, fused, fused_calls = run(name, True, monkeypatch, dense_bn_model)
    _, generic, generic_calls = run(name, False, monkeypatch, dense_bn_model)
    assert (fused_calls, generic_calls) == (STEPS, 0)
    paths = [v.path for v in dense_bn_model().trainable_variables]
    for w, a, b, path in zip(initial, fused, generic, paths):
        # The updates, not the weights: a small update hides its error in
        # a weight. Float32 rounding of the weights at each step stays
        # within `rounding` of the update.
        rounding = 2 * STEPS * np.finfo(np.float32).eps * np.abs(w)
        error = np.abs((a - w) - (b - w))
        assert np.all(error <= RTOL * np.abs(b - w) + rounding + 1e-12), (
            f"{path}: the fused update differs from the generic one by up "
            f"to {np.max(error / (np.abs(b - w) + 1e-30)):.2g} (relative)")
