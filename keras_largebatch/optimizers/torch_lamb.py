"""The LAMB update for the torch backend with `torch._foreach_*` ops.

Same arithmetic as `LAMB.update_step`, batched over all float32 variables,
in place except for one buffer the size of the model that holds `r`:

    g = g / loss_scale           (where a caller folds it in: a 2nd buffer)
    m = beta_1 * m + (1 - beta_1) * g;  v = beta_2 * v + (1 - beta_2) * g**2
    r = m / (sqrt(v) * c1 / sqrt(c2) + epsilon * c1)   # = m_hat / (sqrt(v_hat) + eps)
    r += wd * w                  (decayed variables)
    w -= lr * trust * r          (trust from the two norm vectors)

with `c1, c2 = 1 - beta_1**t, 1 - beta_2**t`. Every scalar that depends on
the step (the learning rate, `1 / loss_scale`, the bias corrections) stays a
device tensor: nothing waits for the device. The mixed wrappers hand this
path unscaled gradients on torch (unscaled in place, in one pass with the
finiteness check), so the division by the loss scale here runs only for a
caller that folds it. Variables of other dtypes go through the per-variable
path.
"""

import keras
import torch

from keras_largebatch.optimizers import torch_foreach


@torch.no_grad()
def update_step(optimizer, grads, variables, learning_rate, gradient_step):
    """`LAMB.update_step` for every variable of the step, `optimizer` a
    `LAMB`, `gradient_step` the `layerwise.GradientStep` it would get."""
    fused, others = torch_foreach.split(optimizer, grads, variables)
    for g, v in others:
        optimizer.update_step(g, v, learning_rate, gradient_step)
    if not fused:
        return
    grads = [g for g, _, _ in fused]
    keras_vars = [v for _, v, _ in fused]
    weights = [v.value for v in keras_vars]
    indices = [optimizer._get_variable_index(v) for v in keras_vars]
    ms = [optimizer.momentums[i].value for i in indices]
    vs = [optimizer.velocities[i].value for i in indices]
    device = weights[0].device
    lr = keras.ops.convert_to_tensor(learning_rate, dtype="float32").to(device)
    c1, c2 = (
        keras.ops.convert_to_tensor(c).to(device)
        for c in optimizer.bias_corrections()
    )

    inverse = gradient_step.inverse_scale  # None: unscaled
    if inverse is not None:
        # A device tensor: as a Python number it would sync with the host.
        inverse = keras.ops.convert_to_tensor(inverse).to(device)
        grads = torch._foreach_mul(grads, inverse)
    torch._foreach_mul_(ms, optimizer.beta_1)
    torch._foreach_add_(ms, grads, alpha=1.0 - optimizer.beta_1)
    torch._foreach_mul_(vs, optimizer.beta_2)
    torch._foreach_addcmul_(vs, grads, grads, value=1.0 - optimizer.beta_2)
    r = torch._foreach_sqrt(vs)
    torch._foreach_mul_(r, c1 / c2.sqrt())
    torch._foreach_add_(r, optimizer.epsilon * c1)
    torch._foreach_reciprocal_(r)
    torch._foreach_mul_(r, ms)

    decayed = [i for i, (_, _, rule) in enumerate(fused) if rule.decayed]
    if decayed:
        torch._foreach_add_(
            [r[i] for i in decayed],
            [weights[i] for i in decayed],
            alpha=optimizer.weight_decay,
        )
    adapted = torch.tensor([rule.adapted for _, _, rule in fused], device=device)
    w_norm, r_norm = torch_foreach.norms(weights), torch_foreach.norms(r)
    valid = adapted & (w_norm > 0) & (r_norm > 0)
    trust = torch.where(valid, w_norm / torch.where(valid, r_norm, 1.0), 1.0)
    if optimizer.trust_clip:
        trust = trust.clamp(max=1.0)
    torch._foreach_addcmul_(weights, r, list(torch.unbind(-lr * trust)))
