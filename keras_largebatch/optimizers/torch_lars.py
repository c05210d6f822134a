"""The LARS update for the torch backend with `torch._foreach_*` ops.

Same arithmetic as `LARS.update_step`, batched over all float32 variables:
one norm per tensor, the trust ratios as one vector, `1 / loss_scale` (from
the mixed optimizers) folded into the per-variable scales, and every update
in place (out-of-place `_foreach_*` ops allocate the model's size again each
step, which alone costs about as much as SGD). Variables of other dtypes go
through the per-variable path.

With momentum on a CPU, the momentum update goes through PyTorch's own
fused SGD kernel (`torch._fused_sgd_`, what `torch.optim.SGD(fused=True)`
runs), once per variable with that variable's scale: with a learning rate
of 1, a weight decay of `scale * wd` and the gradient `scale * g` it
computes `v = momentum * v + scale * (g + wd * w); w = w - v` (Nesterov
likewise) in one vectorised pass. The four `_foreach` passes it replaces
each read and write the whole model; this reads it once. The scaled
gradient is a temporary per variable (the kernel's own `grad_scale` would
overwrite the caller's gradient in place). On CUDA the per-variable scales
would need a host sync, so the `_foreach` passes stay.
"""

import keras
import torch

from keras_largebatch.optimizers import torch_foreach


@torch.no_grad()
def update_step(optimizer, grads, variables, learning_rate, gradient_step):
    """`LARS.update_step` for every variable of the step, `optimizer` a
    `LARS`, `gradient_step` the `layerwise.GradientStep` it would get."""
    fused, others = torch_foreach.split(optimizer, grads, variables)
    for g, v in others:
        optimizer.update_step(g, v, learning_rate, gradient_step)
    if not fused:
        return
    grads = [g for g, _, _ in fused]
    keras_vars = [v for _, v, _ in fused]
    rules = [rule for _, _, rule in fused]
    weights = [v.value for v in keras_vars]
    device = weights[0].device

    decay_list = [optimizer.weight_decay if r.decayed else 0.0 for r in rules]
    decay = torch.tensor(decay_list, dtype=torch.float32, device=device)
    adapted = torch.tensor([r.adapted for r in rules], device=device)
    lr = keras.ops.convert_to_tensor(learning_rate, dtype="float32").to(device)

    w_norm = torch_foreach.norms(weights)
    g_norm = torch_foreach.norms(
        grads,
        [optimizer.known_squared_norm(v, gradient_step) for v in keras_vars],
    )
    inverse = gradient_step.inverse_scale  # None: unscaled
    if inverse is not None:
        inverse = keras.ops.convert_to_tensor(inverse).to(device)
        g_norm = g_norm * inverse
    valid = adapted & (w_norm > 0) & (g_norm > 0)
    denominator = g_norm + decay * w_norm + optimizer.epsilon
    trust = torch.where(
        valid,
        optimizer.eta * w_norm / torch.where(valid, denominator, 1.0),
        1.0,
    )
    scale = lr * trust  # per variable: lr * trust
    grad_scale = scale if inverse is None else scale * inverse
    decayed = [i for i, d in enumerate(decay_list) if d > 0]

    if optimizer.momentum:
        momentum = optimizer.momentum
        bufs = [
            optimizer.momentums[optimizer._get_variable_index(v)].value
            for v in keras_vars
        ]
        if device.type == "cpu":
            _fused_sgd(weights, grads, bufs, grad_scale, scale * decay,
                       momentum, optimizer.nesterov)
            return
        # v = momentum * v + scale * (g + wd * w)
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_addcmul_(bufs, grads, list(torch.unbind(grad_scale)))
        if decayed:
            decay_scales = torch.unbind(scale * decay)
            torch._foreach_addcmul_(
                [bufs[i] for i in decayed],
                [weights[i] for i in decayed],
                [decay_scales[i] for i in decayed],
            )
        if optimizer.nesterov:
            # w = w - momentum * v - scale * (g + wd * w)
            _descend(weights, grads, scale, grad_scale, decay, decayed)
            torch._foreach_add_(weights, bufs, alpha=-momentum)
        else:
            torch._foreach_sub_(weights, bufs)
    else:
        _descend(weights, grads, scale, grad_scale, decay, decayed)


def _fused_sgd(weights, grads, bufs, grad_scale, decay_scale, momentum,
                nesterov):
    """Per variable: `torch._fused_sgd_` with lr 1 on `grad_scale * g` and
    weight decay `decay_scale`, i.e. v = momentum * v + grad_scale * g +
    decay_scale * w, w = w - v (Nesterov: w = w - momentum * v - ...)."""
    for w, g, v, c, d in zip(weights, grads, bufs, grad_scale.tolist(),
                              decay_scale.tolist()):
        torch._fused_sgd_(
            [w], [g * c], [v], weight_decay=d, momentum=momentum, lr=1.0,
            dampening=0.0, nesterov=nesterov, maximize=False,
            is_first_step=False,
        )


def _descend(weights, grads, scale, grad_scale, decay, decayed):
    """w = w - scale * (g + wd * w) = (1 - scale * wd) * w - scale * g,
    with `grad_scale` = scale (times 1 / loss_scale under loss scaling)."""
    if decayed:
        shrink = torch.unbind(1.0 - scale * decay)
        torch._foreach_mul_(
            [weights[i] for i in decayed], [shrink[i] for i in decayed]
        )
    torch._foreach_addcmul_(weights, grads, list(torch.unbind(-grad_scale)))
