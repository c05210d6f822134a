"""The flags of `keras-largebatch-train`, as the driver imports them.

One table, `flag_table.TABLE`, and the modules that read it, each one
concept: `flag_rules` (the checks of the values, alone and together),
`run_config` (the frozen, typed `RunConfig`), `flag_parsing` (absl's
flags, and values to the checked config) and `flag_help` (`--help` and
the table of docs/training.md, which this module prints):

    python -m keras_largebatch.train.flags     # the Markdown table
"""

from keras_largebatch.train.flag_help import help_text
from keras_largebatch.train.flag_help import markdown
from keras_largebatch.train.flag_parsing import config
from keras_largebatch.train.flag_parsing import define_flags
from keras_largebatch.train.flag_rules import RULES
from keras_largebatch.train.flag_rules import check
from keras_largebatch.train.flag_rules import check_after_resume
from keras_largebatch.train.flag_table import BY_NAME
from keras_largebatch.train.flag_table import FREE
from keras_largebatch.train.flag_table import GROUPS
from keras_largebatch.train.flag_table import RAISABLE
from keras_largebatch.train.flag_table import RECORDED
from keras_largebatch.train.flag_table import TABLE
from keras_largebatch.train.flag_table import Flag
from keras_largebatch.train.run_config import RunConfig

__all__ = ["BY_NAME", "FREE", "Flag", "GROUPS", "RAISABLE", "RECORDED",
           "RULES", "RunConfig", "TABLE", "check", "check_after_resume",
           "config", "define_flags", "help_text", "markdown"]

if __name__ == "__main__":
    print(markdown(), end="")
