"""From a command line to the checked `RunConfig`.

`define_flags` defines the flags of `flag_table.TABLE` in absl's
process-global flags, which the driver (`main.parse`) alone reads into
{flag: value}; `config` turns those values, absl's or `run_config.json`'s,
into the `RunConfig`: each value parsed once into the type its field holds
(`--batch_schedule`'s text into `((epoch, batch), ...)`, by its grammar),
checked (`flag_rules.check`) and frozen.
"""

from absl import flags

from keras_largebatch.train import flag_rules
from keras_largebatch.train.flag_table import BY_NAME
from keras_largebatch.train.flag_table import TABLE
from keras_largebatch.train.run_config import RunConfig


def define_flags():
    """Defines the flags of `TABLE` once in absl's process-global flags
    (`main.parse` reads them)."""
    if TABLE[0].name in flags.FLAGS:
        return
    for flag in TABLE:
        define = getattr(flags, f"DEFINE_{flag.kind}")
        if flag.kind == "enum":
            define(flag.name, flag.default, flag.values, flag.help)
        else:
            define(flag.name, flag.default, flag.help)


def config(values):
    """The checked `RunConfig` of `values` ({name: value}, every flag, as
    the command line gives them); raises the Keras-style `ValueError`
    naming the first bad flag."""
    parsed = {name: BY_NAME[name].parse(value)
              for name, value in values.items()}
    flag_rules.check(parsed)
    return RunConfig.of(parsed)
