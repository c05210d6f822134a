"""Which Keras backend is chosen and installed, read without importing Keras.

Importing Keras imports its backend, TensorFlow unless `KERAS_BACKEND` or
`keras.json` chooses another, and fails with a long traceback where that
backend is not installed. `missing()` says so in one line instead: the
command's entry point (`train/cli.py`) prints it.
"""

import difflib
import importlib.util
import json
import os

BACKENDS = ("tensorflow", "jax", "torch")


def chosen():
    """`(backend, where it was chosen)`, as Keras reads it at import:
    `KERAS_BACKEND`, else `keras.json` (in `KERAS_HOME` or `~/.keras`),
    else its default, TensorFlow."""
    name = os.environ.get("KERAS_BACKEND")
    if name:
        return name, "KERAS_BACKEND"
    home = os.environ.get("KERAS_HOME")
    if home is None:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp",
                            ".keras")
    path = os.path.join(os.path.expanduser(home), "keras.json")
    try:
        with open(path) as f:
            name = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        name = None
    if name:
        return name, path
    return "tensorflow", "Keras' default: KERAS_BACKEND is not set"


def installed():
    """The backends of `BACKENDS` that are installed."""
    return [name for name in BACKENDS if _installed(name)]


# The backends Keras knows besides `BACKENDS` (it cannot train on them).
OTHER_KERAS_BACKENDS = ("numpy", "openvino")


def missing():
    """The line saying that the chosen backend is unknown or not
    installed, which are and how to choose one; None where it is
    installed (or is one of `OTHER_KERAS_BACKENDS`, left to Keras)."""
    name, source = chosen()
    if name not in BACKENDS + OTHER_KERAS_BACKENDS:
        return unknown(name, source)
    if name not in BACKENDS or _installed(name):
        return None
    found = installed()
    if not found:
        return (f"Keras' backend {name!r} ({source}) is not installed, nor "
                "is any other: install one, e.g. `pip install jax`, or "
                "`pip install keras-largebatch[jax]` (or [torch], "
                "[tensorflow]).")
    return (f"Keras' backend {name!r} ({source}) is not installed; "
            f"installed: {', '.join(found)}. Choose one with "
            f"KERAS_BACKEND={found[0]} (or \"backend\" in keras.json), or "
            f"install {name}.")


def unknown(name, source):
    """The line for a backend `name` Keras does not know (`JAX`,
    `bogus`), naming the nearest one."""
    known = BACKENDS + OTHER_KERAS_BACKENDS
    near = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.5)
    guess = near[0] if near else (installed() or ["tensorflow"])[0]
    return (f"Keras' backend {name!r} ({source}) is not one Keras knows: "
            f"use one of {', '.join(BACKENDS)} (lowercase), e.g. "
            f"KERAS_BACKEND={guess}.")


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
