from absl import app
from absl import flags

from keras_largebatch.distribute.cost_model import cli

if __name__ == "__main__":
    cli.define_flags()
    flags.adopt_module_key_flags(cli)
    app.run(cli.main)
