"""The LARS update for the torch backend with `torch._foreach_*` ops.

Same arithmetic as `LARS.update_step`, batched over all float32 variables
(others go through the per-variable path): the norms of the weights and
of the gradients in one `_foreach_norm` (or the gradients' from the
squared norms a mixed wrapper took in its finiteness check), the trust
ratios as one vector with the exclusions as masks made once (not copied
to the device each step), `1 / loss_scale` folded
into the per-variable gradient scales, and every update in place
(out-of-place `_foreach_*` ops allocate the model's size again each step):

    c = lr * trust (/ loss_scale);  d = lr * trust * wd
    v *= momentum;  v += c * g;  v += d * w       (decayed variables)
    w -= v                                          (Nesterov: see below)

A constant number of ops per step, with no host sync; all compile under
`torch.compile`. Per-variable scalars enter through `_foreach_addcmul_`,
which on CUDA runs its multi-tensor kernel with them (`_foreach_mul_` or
`_foreach_add_` given a list of 0-d tensors launches one kernel per
tensor there).

With momentum, eagerly on a CPU, those four passes over the model are one
op instead, `keras_largebatch::lars_momentum_` (`momentum_cpu`), whose CPU
kernel runs PyTorch's fused SGD kernel (`torch._fused_sgd_`, what
`torch.optim.SGD(fused=True)` runs) tensor by tensor: one vectorised pass
over each weight and buffer, after a scaled copy of the gradient. A CPU
launches nothing, so a loop over tensors inside one op costs a function
call per tensor, as PyTorch's own CPU multi-tensor kernels do; the four
`_foreach_*` passes read and write the model about twice as often
(`docs/benchmarks.md`). Under `torch.compile` and on other devices the
`_foreach_*` ops stay.

A step a mixed wrapper may skip (`GradientStep.finite`, a device flag) is
masked without a host read: `c`, `d` and the weights' update are 0 where
the flag is false, the momentum 1, the gradients zeroed
(`torch_foreach.where_finite`); the CPU op hands the flag to the fused
kernel, which then writes nothing (as `torch.amp.GradScaler` does).
"""

from typing import List
from typing import Optional

import torch

from keras_largebatch.optimizers import torch_foreach


MASKS_SKIPPED_STEPS = True
"""A `GradientStep.finite` flag masks the step (`torch_foreach`)."""


@torch.no_grad()
def update_step(optimizer, grads, variables, learning_rate, gradient_step):
    """`LARS.update_step` for every variable of the step, `optimizer` a
    `LARS`, `gradient_step` the `layerwise.GradientStep` it would get."""
    batch = torch_foreach.batch(
        optimizer, grads, variables, learning_rate, gradient_step)
    if batch is None:
        return
    grads, keras_vars, weights = batch.grads, batch.variables, batch.weights
    device, decay, decayed = batch.device, batch.decay, batch.decayed

    w_norm, g_norm = torch_foreach.norm_pair(
        weights, grads,
        [optimizer.known_squared_norm(v, gradient_step) for v in keras_vars],
    )
    inverse = gradient_step.inverse_scale  # None: unscaled
    if inverse is not None:
        inverse = torch_foreach.scalar(inverse, device)
        g_norm = g_norm * inverse
    # trust = eta * |w| / (|g| + wd * |w| + epsilon), else 1.
    valid = (torch.minimum(w_norm, g_norm) > 0) & batch.adapted
    denominator = torch.addcmul(g_norm, decay, w_norm)
    if optimizer.epsilon:
        denominator = denominator + optimizer.epsilon
    trust = torch.where(valid, optimizer.eta * w_norm / denominator, 1.0)
    scale = torch_foreach.scalar(learning_rate, device) * trust
    grad_scale = scale if inverse is None else scale * inverse
    decay_scale = scale * decay
    finite = gradient_step.finite
    if finite is not None:
        # A skipped step's norms may be infinite or NaN.
        grad_scale = torch.where(finite, grad_scale, 0.0)
        decay_scale = torch.where(finite, decay_scale, 0.0)

    momentum = optimizer.momentum
    if momentum and uses_cpu_kernel(device):
        torch.ops.keras_largebatch.lars_momentum_(
            weights, grads, bufs_of(optimizer, keras_vars), grad_scale,
            decay_scale, momentum, optimizer.nesterov,
            None if finite is None else (~finite).float())
        return
    if finite is not None:
        grads = torch_foreach.where_finite(grads, finite)
    if not momentum:
        _descend(weights, grads, grad_scale, decay_scale, decayed)
        return
    bufs = bufs_of(optimizer, keras_vars)
    # v = momentum * v + scale * (g + wd * w)
    torch._foreach_mul_(
        bufs,
        momentum if finite is None else torch.where(finite, momentum, 1.0),
    )
    torch._foreach_addcmul_(bufs, grads, torch_foreach.scalars(grad_scale))
    if decayed:
        decay_scales = torch_foreach.scalars(decay_scale)
        torch._foreach_addcmul_(
            [bufs[i] for i in decayed],
            [weights[i] for i in decayed],
            [decay_scales[i] for i in decayed],
        )
    if optimizer.nesterov:
        # w = w - momentum * v - scale * (g + wd * w)
        _descend(weights, grads, grad_scale, decay_scale, decayed)
    factor = -momentum if optimizer.nesterov else -1.0
    if finite is None:
        torch._foreach_add_(weights, bufs, alpha=factor)
    else:
        factor = torch.where(finite, factor, 0.0)
        torch._foreach_addcmul_(weights, bufs, [factor] * len(weights))


def uses_cpu_kernel(device):
    """Whether the momentum update is `lars_momentum_` (eagerly on a CPU)
    rather than the `_foreach_*` ops (compiled, and on other devices)."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


def bufs_of(optimizer, keras_vars):
    """The momentum buffers of `keras_vars`, as torch tensors."""
    return [
        optimizer.momentums[optimizer._get_variable_index(v)].value
        for v in keras_vars
    ]


def _descend(weights, grads, grad_scale, decay_scale, decayed):
    """w = w - decay_scale * w - grad_scale * g (decay_scale = scale * wd,
    grad_scale = scale, times 1 / loss_scale under loss scaling)."""
    if decayed:
        shrink = torch_foreach.scalars(-decay_scale)
        decayed_weights = [weights[i] for i in decayed]
        torch._foreach_addcmul_(
            decayed_weights, decayed_weights, [shrink[i] for i in decayed]
        )
    torch._foreach_addcmul_(weights, grads, torch_foreach.scalars(-grad_scale))


@torch.library.custom_op("keras_largebatch::lars_momentum_",
                         mutates_args=("weights", "bufs"), device_types="cpu")
def momentum_cpu(weights: List[torch.Tensor], grads: List[torch.Tensor],
                 bufs: List[torch.Tensor], grad_scale: torch.Tensor,
                 decay_scale: torch.Tensor, momentum: float,
                 nesterov: bool, found_inf: Optional[torch.Tensor]) -> None:
    """v = momentum * v + grad_scale[i] * g + decay_scale[i] * w, then
    w = w - v (Nesterov: w = w - momentum * v - grad_scale[i] * g -
    decay_scale[i] * w), for each tensor i: `torch._fused_sgd_` with a
    rate of 1, the weight decay `decay_scale[i]` and the gradient
    `grad_scale[i] * g`, written into one scratch buffer (the caller's
    gradients are left as they are). Where `found_inf` (a 0-d float) is 1,
    the kernel writes nothing, as under `torch.amp.GradScaler`."""
    largest = max(g.numel() for g in grads)
    scratch = torch.empty(largest, dtype=torch.float32)
    for w, g, v, c, d in zip(weights, grads, bufs, grad_scale.tolist(),
                              decay_scale.tolist()):
        scaled = scratch[:g.numel()].view(g.shape)
        torch.mul(g, c, out=scaled)
        torch._fused_sgd_(
            [w], [scaled], [v], weight_decay=d, momentum=momentum, lr=1.0,
            dampening=0.0, nesterov=nesterov, maximize=False,
            is_first_step=False, found_inf=found_inf)


@momentum_cpu.register_fake
def _(weights, grads, bufs, grad_scale, decay_scale, momentum, nesterov,
      found_inf):
    return None
