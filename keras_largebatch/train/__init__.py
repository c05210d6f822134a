"""The `keras-largebatch-train` command, a room per concept:

    cli.py          the one door (`run()`): `--help` (`config/help.txt`,
                    generated) and the backend check before Keras is
                    imported
    main.py         the driver's old address (`main.main`, `main.parse`),
                    kept for code written against it; no logic of its own
    config/         the flags: one table (the one source of every default),
                    the typed `RunConfig`, the rules, `parse` and `resolve`
                    (default < recorded run < command line), older runs
    run/            the driver (place, prepare, train or evaluate), devices
                    and processes, fit's callbacks, divergence, Ctrl-C, the
                    banner
    recipe/         the network, learning rate, optimizer and precision
    data/           the data sets, their loaders, augmentation and pipelines
    checkpointing/  the checkpoints and the run folder's lock; takes what it
                    needs as arguments and knows nothing of the flags
    outputs/        what a run writes besides checkpoints: the JSON files and
                    history.csv, the callbacks, the saved model, the report

Data flows one way: `cli` -> `run.driver` -> `config` (-> `checkpointing`
to read a recorded run) and the rooms that build each part of the run from
its config section (`data`, `recipe`, `run.callbacks`, with `outputs` and
`checkpointing`).
"""

PROG = "keras-largebatch-train"

# Ctrl-C: 128 + SIGINT, as a shell reports it (`run/interrupt.py`).
INTERRUPTED = 130
