"""The flags of `keras-largebatch-train`, read from their declarations.

Each flag is declared once, as a field of a `RunConfig` group
(`run_config.py`); `TABLE` holds their `Flag` records in the order of
`--help`, and the rest of `config/` reads them here:

- `rules.py`: each value's check and the rules that read several
  flags together (`check`, `check_after_resume`);
- `load.py`: the absl flags (`define_flags`), the one order of precedence
  (`resolve`: default < the recorded run < the command line) and the
  values turned into the checked `RunConfig` (`config`);
- `help.py`: `--help` and the table in docs/training.md;
- `migration.py`: a flag that an older run did not record takes its
  default.
"""

import dataclasses

from keras_largebatch.train.config.flag import Flag
from keras_largebatch.train.config.run_config import RunConfig

# The parts of `RunConfig`, in order, and who reads each (their
# docstrings).
GROUPS = {part.name: " ".join(part.type.__doc__.split())
          for part in dataclasses.fields(RunConfig)}
TABLE = tuple(Flag.of(field, part.name)
              for part in dataclasses.fields(RunConfig)
              for field in dataclasses.fields(part.type))
BY_NAME = {flag.name: flag for flag in TABLE}
RECORDED = tuple(flag.name for flag in TABLE if flag.recorded)
FREE = tuple(flag.name for flag in TABLE if flag.free)
RAISABLE = tuple(flag.name for flag in TABLE if flag.raise_only)
