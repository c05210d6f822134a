"""A mixed optimizer's checkpoint: one keyed store that only it reads.

Keras saves an optimizer's variables by position under `optimizer/vars`
(and a `LossScaleOptimizer`'s inner optimizer's under
`optimizer/inner_optimizer/vars`), and a reader assigns them by position
wherever the count matches its own. Another optimizer whose count happens to
match (an unbuilt `LossScaleOptimizer(Adam)` holds as many variables as a
`LARSMixed` owns) would take them for its own. So `LARSMixed` and
`LAMBMixed` leave both of those stores empty: a stock reader finds no
variables there and skips them with Keras' warning. Their whole state,
every variable of `optimizer.variables` (the loss scale, the masters, the
rule's slots, whatever the wrapper and the rule hold), goes to
`optimizer/mixed_state/vars`, by position, with a record of its layout:

```python
store["layout"] = json({"optimizer": "LARSMixed", "rule": "LARS",
                        "variables": [[shape, dtype], ...]})
store["0"], store["1"], ... = optimizer.variables
```

A reader loads it only when its own layout is the same (then bit for bit),
and otherwise skips it with a warning worded as Keras' own.
"""

import json
import warnings
import weakref

import keras
import numpy as np

# Keras' saving gives every `KerasSaveable` attribute of a saved object a
# store of its own, at the attribute's path; no public class is one.
from keras.src.saving.keras_saveable import KerasSaveable

ATTRIBUTE = "mixed_state"
"""The attribute of a mixed optimizer (and the path under its own) that
holds its state in a checkpoint."""

_LAYOUT = "layout"


class OptimizerState(KerasSaveable):
    """What saving walks to store `optimizer`'s state, keyed by its layout.

    Holds the optimizer weakly: the saver walks this object's attributes,
    and must not reach the optimizer a second time.
    """

    def __init__(self, optimizer):
        self._optimizer = weakref.ref(optimizer)

    def _obj_type(self):
        # Keras' saving walks the attributes an `Optimizer` lacks.
        return "Optimizer"

    def layout(self):
        """The classes and each variable's shape and dtype, in the order
        of `optimizer.variables`."""
        optimizer = self._optimizer()
        return {
            "optimizer": type(optimizer).__name__,
            "rule": type(optimizer.inner_optimizer).__name__,
            "variables": [
                [list(v.shape), keras.backend.standardize_dtype(v.dtype)]
                for v in optimizer.variables
            ],
        }

    def save_own_variables(self, store):
        store[_LAYOUT] = np.frombuffer(
            json.dumps(self.layout()).encode(), dtype=np.uint8
        )
        for i, variable in enumerate(self._optimizer().variables):
            store[str(i)] = keras.ops.convert_to_numpy(variable)

    def load_own_variables(self, store):
        optimizer = self._optimizer()
        expected = self.layout()
        found = _saved_layout(store)
        if found == expected:
            for i, variable in enumerate(optimizer.variables):
                variable.assign(store[str(i)])
            return
        if found is None:
            reason = (
                f"the checkpoint holds no {expected['optimizer']} state "
                "(another optimizer, or a keras_largebatch before the keyed "
                "store, wrote it)"
            )
        else:
            reason = (
                f"it has {_describe(expected)} whereas the saved optimizer "
                f"has {_describe(found)}"
            )
        message = (
            f"Skipping variable loading for optimizer '{optimizer.name}', "
            f"because {reason}. "
        )
        if not optimizer.built:
            message += (
                "This is likely because the optimizer has not been "
                "called/built yet."
            )
        warnings.warn(message, stacklevel=2)


def _saved_layout(store):
    if _LAYOUT not in store.keys():
        return None
    return json.loads(np.asarray(store[_LAYOUT], dtype=np.uint8).tobytes())


def _describe(layout):
    return (
        f"{len(layout['variables'])} variables ({layout['optimizer']} around "
        f"{layout['rule']})"
    )
