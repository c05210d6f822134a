"""The LARS update for the torch backend with `torch._foreach_*` ops.

Same arithmetic as `LARS.update_step`, batched over all float32 variables:
norms by `_foreach_norm`, the trust ratios as one vector, and every update
in place (out-of-place `_foreach_*` ops allocate the model's size again each
step, which alone costs about as much as SGD). Variables of other dtypes go
through the per-variable path.
"""

import keras
import torch

from keras_largebatch.optimizers import lars as lars_module
from keras_largebatch.optimizers import torch_foreach


@torch.no_grad()
def update_step(optimizer, grads, variables, learning_rate):
    fused, others = torch_foreach.split(optimizer, grads, variables)
    for g, v in others:
        lars_module.LARS.update_step(optimizer, g, v, learning_rate)
    if not fused:
        return
    grads = [g for g, _, _ in fused]
    keras_vars = [v for _, v, _ in fused]
    flags = [flag for _, _, flag in fused]
    weights = [v.value for v in keras_vars]
    device = weights[0].device

    decay_list = [optimizer.weight_decay if d else 0.0 for _, d, _ in flags]
    decay = torch.tensor(decay_list, dtype=torch.float32, device=device)
    adapted = torch.tensor([a for _, _, a in flags], device=device)
    lr = keras.ops.convert_to_tensor(learning_rate, dtype="float32").to(device)

    w_norm, g_norm = torch_foreach.norms(weights), torch_foreach.norms(grads)
    valid = adapted & (w_norm > 0) & (g_norm > 0)
    denominator = g_norm + decay * w_norm + optimizer.epsilon
    trust = torch.where(
        valid,
        optimizer.eta * w_norm / torch.where(valid, denominator, 1.0),
        1.0,
    )
    scale = lr * trust  # per variable: lr * trust
    scales = list(torch.unbind(scale))
    decayed = [i for i, d in enumerate(decay_list) if d > 0]

    if optimizer.momentum:
        momentum = optimizer.momentum
        bufs = [
            optimizer.momentums[optimizer._get_variable_index(v)].value
            for v in keras_vars
        ]
        # v = momentum * v + scale * (g + wd * w)
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_addcmul_(bufs, grads, scales)
        if decayed:
            decay_scales = torch.unbind(scale * decay)
            torch._foreach_addcmul_(
                [bufs[i] for i in decayed],
                [weights[i] for i in decayed],
                [decay_scales[i] for i in decayed],
            )
        if optimizer.nesterov:
            # w = w - momentum * v - scale * (g + wd * w)
            _descend(weights, grads, scale, decay, decayed)
            torch._foreach_add_(weights, bufs, alpha=-momentum)
        else:
            torch._foreach_sub_(weights, bufs)
    else:
        _descend(weights, grads, scale, decay, decayed)


def _descend(weights, grads, scale, decay, decayed):
    """w = w - scale * (g + wd * w) = (1 - scale * wd) * w - scale * g."""
    if decayed:
        shrink = torch.unbind(1.0 - scale * decay)
        torch._foreach_mul_(
            [weights[i] for i in decayed], [shrink[i] for i in decayed]
        )
    torch._foreach_addcmul_(weights, grads, list(torch.unbind(-scale)))
