"""Argument checks and atomic writes, shared by every part of the package.

Errors follow Keras: a `ValueError` that names the argument in backticks,
says what would be valid and echoes what it got:

```
`warmup_epochs` must be >= 0. Received: warmup_epochs=-1
```

Pure Python: the cost model, the applications and the training command
import it without TensorFlow, the optimizers or the strategy.
"""

import contextlib
import json
import os


def require(condition, name, value, expected):
    """Raises the Keras-style `ValueError` unless `condition` holds.

    Args:
        condition: whether `value` is acceptable.
        name: the argument's name, as the user wrote it.
        value: what the user passed (strings are shown quoted).
        expected: what would be valid, e.g. `"an int >= 1"`, `"in [0, 1)"`.
    """
    if not condition:
        shown = repr(value) if isinstance(value, str) else value
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={shown}")


def is_number(value):
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name, value, minimum):
    """Requires an int (not a bool) >= `minimum`; returns `value`."""
    require(
        isinstance(value, int) and not isinstance(value, bool)
        and value >= minimum,
        name, value, f"an int >= {minimum}",
    )
    return value


def check_number(name, value, valid, expected, optional=False):
    """Requires a number for which `valid(value)` holds; returns `value`.

    With `optional`, non-numbers (schedules, callables) pass unchecked.
    `expected` describes `valid`, e.g. `">= 0"`.
    """
    if optional and not is_number(value):
        return value
    require(is_number(value) and valid(value), name, value, f"a float {expected}")
    return value


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path beside `path`; renames it onto `path` on exit.

    Readers see the old file or the whole new one, never a partial write
    (`os.replace` is atomic within a file system). The temporary name keeps
    `path`'s suffix (Keras checks `.weights.h5`, `.keras`), and is removed
    when the block raises.
    """
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{base}")
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def atomic_write(path, text):
    """Writes the string `text` to `path` atomically (see `atomic_path`)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)


def write_json(path, obj):
    """Writes `obj` as sorted, indented JSON to `path` atomically: every
    JSON file the training command writes (run_config.json, summary.json,
    eval.json, the checkpoints' metadata)."""
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def registrar(table, base):
    """The `register` decorator of a registry: it adds an instance of a
    `base` subclass with a new `name` to `table` ({name: instance}) and
    returns the class (the adaptive batch's policies and rate rules)."""

    def register(cls):
        require(isinstance(cls, type) and issubclass(cls, base)
                and isinstance(cls.name, str) and cls.name not in table,
                "cls", cls, f"a {base.__name__} subclass with a new `name`")
        table[cls.name] = cls()
        return cls

    return register
