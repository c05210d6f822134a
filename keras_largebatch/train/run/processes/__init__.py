"""Several processes: JAX's `keras.distribution` (`jax_cluster`), torch's
`torchrun` (`torch_cluster`), and the supervisor that runs each JAX
process's command in a child and names a lost one (`supervisor`)."""

import os


def int_variables(names, why):
    """{name: int} of the environment variables `names`; a `ValueError`
    naming the first that is unset or not an int, with `why` (when or by
    whom it is set)."""
    found = {}
    for name in names:
        raw = os.environ.get(name)
        try:
            found[name] = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"`{name}` must be an int ({why}). "
                             f"Received: {name}={raw!r}") from None
    return found
