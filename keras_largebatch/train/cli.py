"""The console script `keras-largebatch-train`, the command's one door:
what it answers before Keras is imported.

Importing Keras fails with a long traceback where its chosen backend is
not installed (`_backend`). So `run()` answers `--help` from the flags'
declarations (`config.help.help_text`; `config/` imports no Keras) and
checks that the chosen backend is installed, both without Keras, before
handing the command line to the driver (`run.driver.main`):

    keras-largebatch-train --help       # exit 0, with or without a backend
    keras-largebatch-train ...          # backend missing: one line, exit 2
    python -m keras_largebatch.train.cli ...   # the same

Ctrl-C or SIGTERM before the driver takes the signals over (while Keras
and the backend are imported, the flags read: nothing is written yet)
ends the command at once with one line and exit code 130 or 143, not an
import's traceback (`train.stop_while_starting`, which the package's `__init__`
calls first in the command's own process; then `run.interrupt`).

This module imports nothing of Keras; the package's `__init__` must not
either where the chosen backend is missing, or nothing here runs, nor for
`--help` (`train.asks_for_help`), so that it answers at once.
"""

import os
import sys

from keras_largebatch import _backend
from keras_largebatch import train
from keras_largebatch.train import INTERRUPTED
from keras_largebatch.train import PROG
from keras_largebatch.train import TERMINATED
from keras_largebatch.train.config.help import help_text


def run(argv=None):
    """Console-script entry point."""
    train.stop_while_starting()
    end(main(sys.argv if argv is None else argv))


def end(code):
    """Ends the process with `code`; after a signal at once, so that no
    thread a library left running keeps it alive."""
    if code in (INTERRUPTED, TERMINATED):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv):
    """`--help`, or the backend check, then the driver's `main(argv)`;
    returns the exit code."""
    if train.asks_for_help(argv):
        print(help_text(PROG))
        return 0
    problem = _backend.missing()
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    from keras_largebatch.train.run import driver

    return driver.main(argv)


if __name__ == "__main__":
    run()
