"""Which variables get weight decay and layer-wise adaptation.

Jia et al. (2018) lifted ResNet-50 at batch 64K from 71.9% to 75.8% top-1 by
not decaying biases and batch-norm parameters. Their rule, used throughout
this package: only variables with more than one dimension (conv and dense
kernels) are decayed and adapted. Extra exclusions are regular expressions
matched against `variable.path` (for example `"dense_1/kernel"`), because
Keras 3's `variable.name` is only the short name (`"kernel"`), so a list of
names there silently excludes every kernel or nothing.
"""

import re

import keras

from keras_largebatch._shared import require
from keras_largebatch._wrappers import innermost
from keras_largebatch.api_export import keras_largebatch_export


def compile_patterns(patterns, argument_name):
    """Validates a list of regexes and returns them compiled.

    `None` and `[]` mean no pattern. Raises `ValueError` naming
    `argument_name` for a bare string (a common slip that would otherwise
    match character by character) or a pattern that does not compile.
    """
    if patterns is None:
        return ()
    require(
        not isinstance(patterns, str) and hasattr(patterns, "__iter__"),
        argument_name, patterns,
        "a list of regular expressions, matched against `variable.path`",
    )
    compiled = []
    for pattern in patterns:
        require(isinstance(pattern, str), argument_name, patterns,
                "a list of strings (regular expressions)")
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise ValueError(
                f"`{argument_name}` holds an invalid regular expression "
                f"{pattern!r} ({e}). Received: {argument_name}={patterns!r}"
            ) from None
    return tuple(compiled)


def variable_path(variable):
    return getattr(variable, "path", None) or variable.name


def is_kernel_like(variable):
    """True for variables that LARS decays and adapts by default (ndim > 1)."""
    return len(variable.shape) > 1


def matches_any(variable, compiled_patterns):
    path = variable_path(variable)
    return any(p.search(path) for p in compiled_patterns)


@keras_largebatch_export("keras_largebatch.no_decay_variables")
def no_decay_variables(model_or_variables, extra_patterns=None):
    """Lists the trainable variables that must not be weight-decayed.

    These are biases, batch-norm gamma and beta (every variable with
    `ndim <= 1`), plus those whose `path` matches one of `extra_patterns`.

    Args:
        model_or_variables: A `keras.Model` (or layer) or a list of variables.
        extra_patterns: Optional list of regexes matched against
            `variable.path`.

    Returns:
        A list of variables, in the model's order.
    """
    patterns = compile_patterns(extra_patterns, "extra_patterns")
    if isinstance(model_or_variables, (keras.layers.Layer, keras.Model)):
        variables = model_or_variables.trainable_variables
    else:
        variables = list(model_or_variables)
    return [
        v
        for v in variables
        if not is_kernel_like(v) or matches_any(v, patterns)
    ]


@keras_largebatch_export("keras_largebatch.exclude_bias_and_norm")
def exclude_bias_and_norm(optimizer, model, extra_patterns=None):
    """Stops any Keras optimizer from decaying biases and BN parameters.

    Works with stock optimizers that take `weight_decay` (`SGD`, `AdamW`,
    ...) through their own `exclude_from_weight_decay(var_list=...)`; call it
    before the optimizer is built (before `fit` or the first `apply`). Under
    wrappers (`LossScaleOptimizer`, `LARSMixed`, `NoiseScaleOptimizer`) the
    innermost optimizer, the rule, takes the exclusions.

    ```python
    opt = keras.optimizers.AdamW(1e-3, weight_decay=5e-4)
    keras_largebatch.exclude_bias_and_norm(opt, model)
    model.compile(optimizer=opt, loss=...)
    ```

    Note that Keras does not save the `var_list` given to
    `exclude_from_weight_decay`; after `load_model`, call this again. `LARS`
    keeps its exclusions as constructor arguments, which are saved.

    Returns:
        The list of excluded variables.
    """
    target = innermost(optimizer)
    if getattr(target, "built", False):
        raise ValueError(
            "`exclude_bias_and_norm` must be called before the optimizer is "
            f"built. Received: optimizer={optimizer!r} (already built)"
        )
    excluded = no_decay_variables(model, extra_patterns)
    target.exclude_from_weight_decay(var_list=excluded)
    return excluded
