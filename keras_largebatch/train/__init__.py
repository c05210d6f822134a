"""The `keras-largebatch-train` command, a room per concept:

    cli.py          the one door (`run()`): `--help` (from the flags'
                    declarations) and the backend check before Keras is
                    imported
    main.py         the driver's old address (`main.main`, `main.parse`),
                    kept for code written against it; no logic of its own
    config/         the flags: the typed `RunConfig`, each flag declared once
                    as its field (default, help, checks, resume rules), the
                    rules, `parse` and `resolve` (default < recorded run <
                    command line), older runs; no Keras at import
    run/            the driver (place, prepare, train or evaluate), devices
                    and processes, fit's callbacks, divergence, signals, the
                    banner
    recipe/         the network, learning rate, optimizer and precision
    data/           the data sets, their loaders, augmentation and pipelines
    checkpointing/  the checkpoints and the run folder's lock; takes what it
                    needs as arguments and knows nothing of the flags
    outputs/        what a run writes besides checkpoints: the JSON files and
                    history.csv, the callbacks, the saved model, the report
    layout.py       the run folder: every name the command writes in
                    `model_dir`, read by `checkpointing`, `outputs`, `run`,
                    `config` and bench/

Data flows one way: `cli` -> `run.driver` -> `config` (-> `checkpointing`
to read a recorded run) and the rooms that build each part of the run from
its config section (`data`, `recipe`, `run.callbacks`, with `outputs` and
`checkpointing`).
"""

import contextlib
import os
import signal
import sys

PROG = "keras-largebatch-train"

# Ctrl-C and SIGTERM: 128 + the signal, as a shell and a scheduler report
# them (`run/interrupt.py`).
INTERRUPTED = 130
TERMINATED = 143

HELP = ("--help", "-help", "-h", "-?", "--helpshort")


def asks_for_help(argv):
    """Whether the command line `argv` (argv[0] the program) asks for
    `--help`, which `cli` answers from the flags' declarations alone."""
    return any(arg in HELP for arg in argv[1:])


def stop_while_starting():
    """Until the driver takes them over: SIGINT and SIGTERM end the
    process at once, with one line."""
    def handler(signum, frame):
        said = ("interrupted (Ctrl-C)" if signum == signal.SIGINT
                else f"stopped by {signal.Signals(signum).name}")
        with contextlib.suppress(Exception):  # Not inside a `print`.
            sys.stdout.flush()
        os.write(2, f"{PROG}: {said} while starting, before anything was "
                    f"written: the same command starts or resumes the run "
                    f"as this one would have\n".encode())
        os._exit(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
