"""`--batch_schedule`'s grammar, in one place: `EPOCH:BATCH,...` to
`((epoch, batch), ...)` and back.

    parse("batch_schedule", "0:512, 4:1024")   # ((0, 512), (4, 1024))
    show(((0, 512), (4, 1024)))                # '0:512,4:1024'

The flags parse it once (`load.config`): `RunConfig.adaptive`
holds the pairs `AdaptiveBatch(schedule=...)` takes, and `run_config.json`
and the errors show them as `show` writes them. Whether the epochs
increase and the batches fit is the adaptive batch's check
(`adaptive_batch.batches`), not the grammar's.
"""

from keras_largebatch._shared import require

TYPE = tuple[tuple[int, int], ...]
EXPECTED = "EPOCH:BATCH,... with int epochs >= 0 and batches >= 1"


def parse(name, text):
    """The `((epoch, batch), ...)` of `text` ('' gives `()`); raises the
    Keras-style `ValueError` naming `name` where it is malformed."""
    require(isinstance(text, str), name, text, EXPECTED)
    steps = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        epoch, sep, batch = item.partition(":")
        try:
            step = (int(epoch), int(batch))
        except ValueError:
            step = None
        require(sep and step and step[0] >= 0 and step[1] >= 1, name, text,
                EXPECTED)
        steps.append(step)
    return tuple(steps)


def show(steps):
    """`steps` as `--batch_schedule` writes them: `EPOCH:BATCH,...`."""
    return ",".join(f"{epoch}:{batch}" for epoch, batch in steps)
