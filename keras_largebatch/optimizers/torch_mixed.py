"""`MixedOptimizer`'s step on the torch backend, which never waits for the
device.

The finiteness check is one `_foreach_norm` of the gradients (their squared
norms are LARS's gradient norms, `1 / loss_scale` then folded into the
rule), or, for a rule that takes unscaled gradients, the unscaling in place
with the check in one pass (`torch._amp_foreach_non_finite_check_and_unscale_`,
the kernel of `torch.amp.GradScaler`). Whether to skip the step stays a
device flag, handed to the rule in its `GradientStep`: the rule masks its
update with it (`layerwise.masks_skipped_steps`), and the loss scale halves
or grows in `torch._amp_update_scale_`, `torch.amp`'s kernel. So the step reads
nothing on the host, and compiles under `torch.compile` as one graph.
Keras' `LossScaleOptimizer` reads the flag on the host here; so does this
step where the rule cannot mask (an EMA, gradient accumulation, Keras'
`overwrite_with_gradient` variables, `use_fused_path=False`).
"""

import keras
import torch
from keras import ops

from keras_largebatch.optimizers import layerwise
from keras_largebatch.optimizers import torch_foreach


def apply(optimizer, grads, variables):
    """`MixedOptimizer.apply` on torch: the rule on the masters if every
    gradient is finite, else no update and half the loss scale, with the
    flag kept on the device where the rule can mask a skipped step."""
    grads = [None if g is None else ops.cast(g, "float32") for g in grads]
    # Folding `1 / loss_scale` into the rule saves a write of each gradient
    # where the rule takes the squared norms of the check (its gradient
    # norms); otherwise unscaling in place in the check's pass saves the
    # rule a scaled copy.
    inner = optimizer.inner_optimizer
    if optimizer._folds_unscaling() and inner.reads_gradient_norms:
        finite, squares = check_finite(grads)
        unscaled = False
    else:
        inverse = 1.0 / optimizer.dynamic_scale.value
        finite = unscale_and_check(grads, inverse)
        squares, unscaled = None, True
    if masks_skipped_steps(optimizer, variables):
        optimizer._apply_finite(grads, variables, squares, unscaled,
                                finite=finite)
    elif bool(finite):
        optimizer._apply_finite(grads, variables, squares, unscaled)
    else:
        optimizer._skip()


def masks_skipped_steps(optimizer, variables):
    """Whether the mixed `optimizer`'s rule masks a skipped step here, so
    that the step needs no host read."""
    return layerwise.masks_skipped_steps(optimizer.inner_optimizer) and not any(
        getattr(v, "overwrite_with_gradient", False) for v in variables)


@torch.no_grad()
def update_scale(optimizer, finite):
    """The dynamic loss scale after a step whose device flag is `finite`:
    half on a skipped step (the count restarts), twice after
    `dynamic_growth_steps` finite ones, in one kernel on the device. (It
    keeps the scale where twice would overflow float32.)"""
    torch._amp_update_scale_(
        optimizer.dynamic_scale.value, optimizer.step_counter.value,
        (~finite).float(), 2.0, 0.5, optimizer.dynamic_growth_steps)


@torch.no_grad()
def check_finite(grads):
    """Returns `(finite, squares)`: whether every gradient is finite, from
    one read of each (a NaN or an infinity makes its norm non-finite; so
    does a finite sum of squares that overflows float32, which only skips
    a step), and each gradient's squared norm as a 0-d tensor (None for a
    missing gradient)."""
    tensors = [keras.ops.convert_to_tensor(g) for g in grads if g is not None]
    if not tensors:
        return torch.tensor(True), [None] * len(grads)
    squares = torch_foreach.squared_norms(tensors)
    found = iter(torch_foreach.scalars(squares))
    return (
        torch.isfinite(squares.sum()),
        [None if g is None else next(found) for g in grads],
    )


@torch.no_grad()
def unscale_and_check(grads, inverse):
    """Multiplies the float32 `grads` by `inverse` in place and returns
    whether all are finite: one pass."""
    tensors = [g for g in grads if g is not None]
    if not tensors:
        return torch.tensor(True)
    found_inf = torch.zeros(1, device=tensors[0].device)
    inverse = torch_foreach.scalar(inverse, found_inf.device).reshape(1)
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, inverse)
    return found_inf[0] == 0
