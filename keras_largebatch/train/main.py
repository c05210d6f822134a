"""The driver's address before the rooms, kept for code and commands
written against it: `main.main(argv)` (returns the exit code),
`main.parse(argv)` and `python -m keras_largebatch.train.main ...` (the
command, through the one door, `cli.run`). The driver lives in
`run/driver.py`, the parsing in `config/load.py`."""

if __name__ == "__main__":
    from keras_largebatch.train import cli

    cli.run()
else:
    from keras_largebatch.train.config.load import parse  # noqa: F401
    from keras_largebatch.train.run.driver import main  # noqa: F401
