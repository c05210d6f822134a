"""From a command line to the checked `RunConfig`, in four steps:

    parse_run(argv) absl's flags (`define_flags`), read here alone: the
                    flags the command line gives
    recorded_run(model_dir, mode)
                    the run recorded in `model_dir`, read once (its
                    run_config.json in today's flags by `migration.upgrade`,
                    its raises of --epochs), handed on to resume it
    resolve(given, recorded)
                    every flag's value, in one order of precedence: the
                    table's default < the recorded run < the command line
    config(values)  each value parsed once into the type its field holds
                    (`--batch_schedule`'s text into `((epoch, batch),
                    ...)`, by its grammar), checked (`rules.check`) and
                    frozen
"""

import os

from absl import app
from absl import flags

from keras_largebatch.train import layout
from keras_largebatch.train.config import migration
from keras_largebatch.train.config import rules
from keras_largebatch.train.config.run_config import RunConfig
from keras_largebatch.train.config.table import BY_NAME
from keras_largebatch.train.config.table import TABLE


def define_flags():
    """Defines the flags of `TABLE` once in absl's process-global flags
    (`parse` reads them)."""
    if TABLE[0].name in flags.FLAGS:
        return
    for flag in TABLE:
        define = getattr(flags, f"DEFINE_{flag.kind}")
        if flag.kind == "enum":
            define(flag.name, flag.default, flag.values, flag.help)
        else:
            define(flag.name, flag.default, flag.help)


def parse(argv):
    """The checked `RunConfig` of `argv` (argv[0] is the program). Raises
    absl's `flags.Error` or `ValueError`."""
    return parse_run(argv)[0]


def parse_run(argv):
    """`(config, recorded)`: `parse`'s `RunConfig` of `argv` and the run
    recorded in its `model_dir` (`recorded_run`), which resuming checks
    the config against (`checkpointing.check_model_dir`)."""
    define_flags()
    if "help" not in flags.FLAGS:
        app.define_help_flags()
    FLAGS = flags.FLAGS
    FLAGS.unparse_flags()
    rest = FLAGS(list(argv))
    if len(rest) > 1:
        raise ValueError(f"Unexpected arguments: {' '.join(rest[1:])}")
    given = {name: FLAGS[name].value for name in BY_NAME
             if FLAGS[name].present}
    recorded = recorded_run(
        given.get("model_dir", BY_NAME["model_dir"].default),
        given.get("mode", BY_NAME["mode"].default))
    return config(resolve(given, recorded)), recorded


def resolve(given, recorded=None):
    """{flag: value} of every flag of `TABLE`: its default, under the run
    `recorded` in `model_dir` (`recorded_run`) where the record decides,
    under `given` (the command line's; a name that is no flag is
    refused).

    The record decides, under `--mode=eval`, every flag but `mode` and
    `model_dir` (the model, data and preprocessing are the run's; `epochs`
    its latest raise), and otherwise the flags of
    `migration.CHANGED_DEFAULTS`, whose defaults changed since older runs:
    a resumed run keeps the defaults it began with. The record's keys that
    are no flags of today are left out.
    """
    unknown = sorted(set(given) - set(BY_NAME))
    if unknown:
        raise ValueError(
            f"Unknown flags: {', '.join(unknown)}. Received: "
            + ", ".join(f"{name}={given[name]!r}" for name in unknown))
    values = {flag.name: flag.default for flag in TABLE}
    mode = given.get("mode", values["mode"])
    record = dict(recorded.flags) if recorded else {}
    if mode == "eval" and recorded and recorded.raises:
        record["epochs"] = recorded.epochs
    decides = (set(values) - {"mode", "model_dir"} if mode == "eval"
               else set(migration.CHANGED_DEFAULTS))
    values.update({name: record[name] for name in decides
                   if name in record})
    values.update(given)
    return values


def config(values):
    """The checked `RunConfig` of `values` ({name: value}, every flag, as
    the command line gives them); raises the Keras-style `ValueError`
    naming the first bad flag."""
    parsed = {name: BY_NAME[name].parse(value)
              for name, value in values.items()}
    rules.check(parsed)
    return RunConfig.of(parsed)


def recorded_run(model_dir, mode="train"):
    """The run recorded in `model_dir` (a `checkpointing.resume.Recorded`;
    None for none): its run_config.json, its fields of the flags' types
    (`rules.check_recorded`), in today's flags, and its raises of
    --epochs. Under `--mode=eval` a run is required."""
    from keras_largebatch.train.checkpointing import resume  # Imports Keras.

    path = os.path.join(model_dir or "", layout.RUN_CONFIG)
    if mode == "eval" and not (model_dir and os.path.isfile(path)):
        raise ValueError(
            "`mode=eval` needs a run in `model_dir` (no run_config.json "
            f"there). Received: model_dir={model_dir!r}")
    if not model_dir or not os.path.exists(path):
        return None
    original = resume.read_run_config(model_dir)
    rules.check_recorded(original, path)
    return resume.Recorded(migration.upgrade(original),
                           resume.read_raises(model_dir))
