"""Fixtures: applying optimizer steps the way each backend's trainer does."""

import keras
import pytest


def apply_step(optimizer, grads, variables):
    """One step. On JAX, a LossScaleOptimizer goes through a jitted
    `stateless_apply`, as `fit` uses it; elsewhere `apply`."""
    if keras.backend.backend() == "jax" and isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        import jax

        if not optimizer.built:
            optimizer.build(variables)
        new_vars, new_opt_vars = jax.jit(optimizer.stateless_apply)(
            [v.value for v in optimizer.variables],
            [keras.ops.convert_to_tensor(g) for g in grads],
            [v.value for v in variables],
        )
        for v, value in zip(variables, new_vars):
            v.assign(value)
        for v, value in zip(optimizer.variables, new_opt_vars):
            v.assign(value)
    else:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)


@pytest.fixture(name="apply_step")
def _apply_step_fixture():
    return apply_step
