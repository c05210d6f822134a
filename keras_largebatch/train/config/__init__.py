"""The flags of `keras-largebatch-train`: each declared once, as a field of
the config it defines; no Keras and no backend at import.

`run_config` (the frozen, typed `RunConfig`, a part per group, each flag
a field that declares its type, default, help, checks and resume rules
through `flag.declare`; `choices` the choices and bounds they name),
`table` (`TABLE`: the flags' `Flag` records, read from those fields),
`rules` (the checks of the values, alone and together), `load` (the
command line and the run recorded in `model_dir`, each read once;
`resolve`, the one order of precedence: default < the recorded run < the
command line), `migration` (runs recorded by older versions, in today's
flags), `batch_schedule` (`--batch_schedule`'s grammar) and `help`
(`--help` and the table of docs/training.md:
`python -m keras_largebatch.train.config.help` prints it).
"""

from keras_largebatch.train.config.flag import Flag
from keras_largebatch.train.config.help import help_text
from keras_largebatch.train.config.help import markdown
from keras_largebatch.train.config.load import config
from keras_largebatch.train.config.load import define_flags
from keras_largebatch.train.config.load import parse
from keras_largebatch.train.config.load import resolve
from keras_largebatch.train.config.migration import upgrade
from keras_largebatch.train.config.rules import RULES
from keras_largebatch.train.config.rules import check
from keras_largebatch.train.config.rules import check_after_resume
from keras_largebatch.train.config.run_config import RunConfig
from keras_largebatch.train.config.table import BY_NAME
from keras_largebatch.train.config.table import FREE
from keras_largebatch.train.config.table import GROUPS
from keras_largebatch.train.config.table import RAISABLE
from keras_largebatch.train.config.table import RECORDED
from keras_largebatch.train.config.table import TABLE

__all__ = ["BY_NAME", "FREE", "Flag", "GROUPS", "RAISABLE", "RECORDED",
           "RULES", "RunConfig", "TABLE", "check", "check_after_resume",
           "config", "define_flags", "help_text", "markdown", "parse",
           "resolve", "upgrade"]
