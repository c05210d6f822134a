"""What the fused torch paths (`torch_lars`, `torch_lamb`) share: which
variables go through `torch._foreach_*`, the norms, the finiteness check."""

import keras
import torch

from keras_largebatch.optimizers import layerwise


def split(optimizer, grads, variables):
    """Returns `(fused, others)`: `fused` holds `(g, v, flags)` for dense
    float32 gradients of updatable float32 variables, `others` the `(g, v)`
    left to the per-variable `update_step`."""
    fused, others = [], []
    for g, v in zip(grads, variables):
        if g is not None and not torch.is_tensor(g):
            g = keras.ops.convert_to_tensor(g)
        flags = optimizer.flags(v)
        dense = g is not None and not g.is_sparse
        float32 = v.dtype == "float32" and g is not None and g.dtype == torch.float32
        if dense and float32 and flags[0]:
            fused.append((g, v, flags))
        else:
            others.append((g, v))
    return fused, others


def squared_norms(tensors):
    """The squared L2 norm of each tensor, as one float32 vector."""
    if tensors[0].is_cuda:
        norms = torch.stack(torch._foreach_norm(tensors))
        return norms * norms
    # On CPU a BLAS dot per tensor reads it once, twice as fast here as
    # `_foreach_norm`, which is a loop of `vector_norm` calls on CPU.
    return torch.stack([torch.dot(t.reshape(-1), t.reshape(-1)) for t in tensors])


def norms(tensors, known=None):
    """The L2 norm of each tensor; `known` holds squared norms computed
    earlier in the step (by the finiteness check), as
    `layerwise.known_squared_norm` reads them."""
    squares = [layerwise.known_squared_norm(known, t) for t in tensors]
    if all(s is not None for s in squares):
        return torch.stack(squares).sqrt()
    return squared_norms(tensors).sqrt()


@torch.no_grad()
def check_finite(grads):
    """Returns `(finite, known)`: whether every gradient is finite, from
    one read of each (a NaN or an infinity makes its squared norm
    non-finite; so does a finite one whose square overflows float32, which
    only skips a step), and the squared norms by tensor id, for `norms`."""
    tensors = [keras.ops.convert_to_tensor(g) for g in grads if g is not None]
    if not tensors:
        return torch.tensor(True), {}
    squares = squared_norms(tensors)
    known = {id(t): (t, s) for t, s in zip(tensors, torch.unbind(squares))}
    return torch.isfinite(squares.sum()), known


@torch.no_grad()
def unscale_and_check(grads, inverse):
    """Multiplies the float32 `grads` by `inverse` in place and returns
    whether all are finite: one pass, the kernel `torch.amp.GradScaler`
    uses."""
    tensors = [g for g in grads if g is not None]
    if not tensors:
        return torch.tensor(True)
    found_inf = torch.zeros(1, device=tensors[0].device)
    inverse = torch.as_tensor(inverse, dtype=torch.float32).reshape(1).to(found_inf.device)
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, inverse)
    return found_inf[0] == 0
