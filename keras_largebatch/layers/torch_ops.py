"""The layers' torch path: torch's own kernels on channels_last views.

An NHWC-contiguous tensor permuted to NCHW, `x.permute(0, 3, 1, 2)`, is an
NCHW tensor in torch's channels_last memory format: no data moves, and
torch's convolution, batch norm and pooling take it as it is and give
channels_last results, which `permute(0, 2, 3, 1)` turns back into NHWC
views. Keras 3.15's torch backend instead copies every activation into
NCHW, back into channels_last, and computes batch norm in five elementwise
ops after separately computed moments.

Each op here is counted: a Python scalar in a binary op costs torch four
more ops (a wrapped tensor and its cast), so scalars enter as an op's own
argument (`lerp`'s weight) or as one `scalar_tensor`.

Imported only on the torch backend (`fast_path.TORCH_OPS`).
"""

import torch
import torch.nn.functional as F
# Keras' own test for a stateless scope (`stateless_call`, symbolic
# builds), where a variable's new value must go through `assign`; Keras
# exports no public one. Pinned by tests/layers/test_layers_torch.py.
from keras.src.backend.common.stateless_scope import in_stateless_scope


def same_padding(size, kernel, stride, dilation=1):
    """`(before, after)` of Keras' (and TensorFlow's) `"same"` padding:
    the output has `ceil(size / stride)` entries, the odd one is after."""
    effective = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + effective - size)
    return total // 2, total - total // 2


def conv2d(x, kernel, bias, strides, padding, dilation, groups):
    """`keras.ops.conv` of NHWC `x` with a `(kh, kw, in / groups, out)`
    kernel, plus `bias`, in one `F.conv2d`; an NHWC view back.

    `"same"` padding that is as long before as after is the convolution's
    own; an uneven one (a stride over an input it does not divide) pads `x`
    first, as Keras does.
    """
    pad = 0
    if padding == "same":
        pads = [same_padding(x.shape[1 + i], kernel.shape[i], strides[i],
                             dilation[i]) for i in range(2)]
        if all(a == b for a, b in pads):
            pad = tuple(a for a, _ in pads)
        else:
            (top, bottom), (left, right) = pads
            x = F.pad(x, (0, 0, left, right, top, bottom))
    # The layout the convolution wants for a channels_last input; converted
    # here, the backward pass reuses it instead of converting again.
    weight = torch.clone(kernel.permute(3, 2, 0, 1),
                         memory_format=torch.channels_last)
    y = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, tuple(strides), pad,
                 tuple(dilation), groups)
    return y.permute(0, 2, 3, 1)


def batch_norm_train(x, axis, gamma, beta, epsilon):
    """Batch norm with the batch's statistics over all axes but `axis`:
    `(outputs, mean, variance)`, the variance biased (divided by the count,
    as Keras') and recovered from the inverse standard deviation
    `native_batch_norm` returns, `1 / invstd**2 - epsilon` (exact to float32
    rounding of `variance + epsilon`)."""
    y, mean, invstd = torch.native_batch_norm(
        channels_second(x, axis), gamma, beta, None, None, True, 0.0,
        epsilon)
    variance = torch.reciprocal(invstd * invstd).sub_(
        torch.scalar_tensor(epsilon, dtype=invstd.dtype))
    return like(y, x, axis), mean, variance


def batch_norm_infer(x, axis, mean, variance, gamma, beta, epsilon):
    """Batch norm with the given statistics, in one kernel."""
    y = F.batch_norm(channels_second(x, axis), mean, variance, gamma, beta,
                     False, 0.0, epsilon)
    return like(y, x, axis)


def channels_second(x, axis):
    """`x` with `axis` at 1, a view: `(-1, channels)` where `axis` is the
    last and `x` contiguous (torch's batch norm takes this 2-D view in the
    same channels_last kernel as a 4-D one, for one op fewer each way than
    a permutation), else `x.permute` bringing `axis` to 1, the others in
    order."""
    axis %= x.ndim
    if axis == x.ndim - 1 and x.is_contiguous():
        return x.view(-1, x.shape[axis])
    rest = [i for i in range(x.ndim) if i != axis]
    return x.permute(rest[0], axis, *rest[1:])


def like(y, x, axis):
    """`channels_second(x, axis)`'s result `y` in `x`'s shape and order."""
    axis %= x.ndim
    if y.ndim != x.ndim:
        return y.view(x.shape)
    return y.movedim(1, axis)


def update_moving(variable, batch, momentum):
    """`variable = variable * momentum + batch * (1 - momentum)`, in place
    in one `lerp_` (Keras' `_direct_assign` also writes in place, under
    `no_grad`); through `variable.assign` in a stateless scope.

    Eagerly, `native_batch_norm` gives float32 statistics for a float16 or
    bfloat16 input; under `torch.compile` its fake kernel gives them in the
    input's dtype, cast here (a cast only where the dtypes differ, so that
    the eager step launches none)."""
    if batch.dtype != variable.value.dtype:
        batch = batch.to(variable.value.dtype)
    if in_stateless_scope():
        variable.assign(torch.lerp(variable.value, batch, 1.0 - momentum))
        return
    with torch.no_grad():
        variable.value.lerp_(batch, 1.0 - momentum)


class _ZeroPad(torch.autograd.Function):
    """`F.pad` with zeros, whose gradient is a view: the padded tensor's
    gradient narrowed to the input's extent. torch's own gradient of `pad`
    (`constant_pad_nd` with negative pads) copies it into a new tensor."""

    @staticmethod
    def forward(x, pads):
        return F.pad(x, pads)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.pads = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        pads = ctx.pads
        for i in range(len(pads) // 2):
            dim, before, after = grad.ndim - 1 - i, pads[2 * i], pads[2 * i + 1]
            if before or after:
                grad = grad.narrow(dim, before,
                                   grad.shape[dim] - before - after)
        return grad, None


def zero_pad(x, pads):
    """`F.pad(x, pads)` with zeros, `pads` non-negative and given as
    `F.pad` takes them (the last dimension's first); the gradient passes
    back as a view, without a copy."""
    return _ZeroPad.apply(x, tuple(pads))


def max_pool2d(x, pool_size, strides, pad):
    """Max pooling of NHWC `x` with symmetric (implicit `-inf`) padding
    `pad`; an NHWC view back."""
    y = F.max_pool2d(x.permute(0, 3, 1, 2), tuple(pool_size), tuple(strides),
                     tuple(pad))
    return y.permute(0, 2, 3, 1)


def relu(x):
    """`max(x, 0)`: Keras' `activations.relu` with its defaults."""
    return torch.relu(x)


def add_all(xs):
    """`xs[0] + xs[1] + ...`, added left to right."""
    y = xs[0]
    for x in xs[1:]:
        y = torch.add(y, x)
    return y
