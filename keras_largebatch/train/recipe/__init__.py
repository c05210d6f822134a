"""The large-batch recipe: the network (`model`), the learning rate
(`rate`: the scaling rules, warmup, polynomial decay), the optimizer
(`optimizer`) and the numeric precision (`precision`)."""

from keras_largebatch.train.recipe.model import DEFAULT_IMAGE_SIZE  # noqa
from keras_largebatch.train.recipe.model import MIN_IMAGE_SIZE  # noqa
from keras_largebatch.train.recipe.model import build_model  # noqa
from keras_largebatch.train.recipe.model import image_size_for  # noqa
from keras_largebatch.train.recipe.model import input_channels  # noqa
from keras_largebatch.train.recipe.model import load_init_weights  # noqa
from keras_largebatch.train.recipe.optimizer import build_optimizer  # noqa
from keras_largebatch.train.recipe.optimizer import compile_model  # noqa
from keras_largebatch.train.recipe.precision import make_deterministic  # noqa
from keras_largebatch.train.recipe.precision import resolve_precision  # noqa
from keras_largebatch.train.recipe.rate import DEFAULT_BASE_LR  # noqa
from keras_largebatch.train.recipe.rate import SGD_WARMUP_FRACTION  # noqa
from keras_largebatch.train.recipe.rate import check_lr_rule  # noqa
from keras_largebatch.train.recipe.rate import lr_rule  # noqa
from keras_largebatch.train.recipe.rate import peak_learning_rate  # noqa
from keras_largebatch.train.recipe.rate import schedule  # noqa
from keras_largebatch.train.recipe.rate import warmup_epochs_for  # noqa
