"""The LAMB update for the torch backend with `torch._foreach_*` ops.

Same arithmetic as `LAMB.update_step`, batched over all float32 variables,
in place except for one buffer the size of the model that holds `q`, the
update `r` times `c1`:

    g = g / loss_scale           (where a caller folds it in: a 2nd buffer)
    m = beta_1 * m + (1 - beta_1) * g;  v = beta_2 * v + (1 - beta_2) * g**2
    q = m / (sqrt(v) / sqrt(c2) + epsilon)    # = c1 * m_hat / (sqrt(v_hat) + eps)
    q += c1 * wd * w             (decayed variables; q = c1 * r)
    trust = c1 * |w| / |q|       (= |w| / |r|, from the two norm vectors)
    w -= (lr * trust / c1) * q   (= lr * trust * r)

with `c1, c2 = 1 - beta_1**t, 1 - beta_2**t`. Every scalar that depends on
the step (the learning rate, `1 / loss_scale`, the bias corrections, the
trust ratios) stays a device tensor: nothing waits for the device. Those
that differ per variable enter through `_foreach_addcmul_`, which on CUDA
runs its multi-tensor kernel with a list of 0-d tensors (`_foreach_mul_`
and `_foreach_add_` launch one kernel per tensor there); `c1` is folded into
them, so that the rest takes one scalar for all. The norms are one
`_foreach_norm` over both lists: a constant number of ops per step, all of which
compile under `torch.compile`. The mixed wrappers hand this path unscaled
gradients on torch (unscaled in place, in one pass with the finiteness
check), so the division by the loss scale here runs only for a caller that
folds it. Variables of other dtypes go through the per-variable path.

A step a mixed wrapper may skip (`GradientStep.finite`, a device flag) is
masked without a host read: the gradients zeroed
(`torch_foreach.where_finite`), the moments' decay 1, the weights' scale 0.
"""

import torch

from keras_largebatch.optimizers import torch_foreach


MASKS_SKIPPED_STEPS = True
"""A `GradientStep.finite` flag masks the step (`torch_foreach`)."""


@torch.no_grad()
def update_step(optimizer, grads, variables, learning_rate, gradient_step):
    """`LAMB.update_step` for every variable of the step, `optimizer` a
    `LAMB`, `gradient_step` the `layerwise.GradientStep` it would get."""
    batch = torch_foreach.batch(
        optimizer, grads, variables, learning_rate, gradient_step)
    if batch is None:
        return
    grads, weights, device = batch.grads, batch.weights, batch.device
    decayed = batch.decayed
    indices = [optimizer._get_variable_index(v) for v in batch.variables]
    ms = [optimizer.momentums[i].value for i in indices]
    vs = [optimizer.velocities[i].value for i in indices]
    lr = torch_foreach.scalar(learning_rate, device)
    c1, c2 = (
        torch_foreach.scalar(c, device) for c in optimizer.bias_corrections()
    )
    finite = gradient_step.finite
    beta_1, beta_2 = optimizer.beta_1, optimizer.beta_2
    if finite is not None:
        # A skipped step: zero gradients, moments kept (a decay of 1).
        grads = torch_foreach.where_finite(grads, finite)
        beta_1 = torch.where(finite, beta_1, 1.0)
        beta_2 = torch.where(finite, beta_2, 1.0)

    inverse = gradient_step.inverse_scale  # None: unscaled
    if inverse is not None:
        grads = torch._foreach_mul(grads, torch_foreach.scalar(inverse, device))
    torch._foreach_mul_(ms, beta_1)
    torch._foreach_add_(ms, grads, alpha=1.0 - optimizer.beta_1)
    torch._foreach_mul_(vs, beta_2)
    torch._foreach_addcmul_(vs, grads, grads, value=1.0 - optimizer.beta_2)
    q = torch._foreach_sqrt(vs)
    torch._foreach_mul_(q, c2.rsqrt())
    torch._foreach_add_(q, optimizer.epsilon)
    torch._foreach_reciprocal_(q)
    torch._foreach_mul_(q, ms)

    if decayed:
        decay = [c1 * optimizer.weight_decay] * len(decayed)
        torch._foreach_addcmul_(
            [q[i] for i in decayed], [weights[i] for i in decayed], decay
        )
    w_norm, q_norm = torch_foreach.norm_pair(weights, q)
    valid = (torch.minimum(w_norm, q_norm) > 0) & batch.adapted
    trust = torch.where(valid, c1 * w_norm / q_norm, 1.0)
    if optimizer.trust_clip:
        trust = trust.clamp(max=1.0)
    step = -lr * trust / c1
    if finite is not None:
        step = torch.where(finite, step, 0.0)
    torch._foreach_addcmul_(weights, q, torch_foreach.scalars(step))
