from keras_largebatch.optimizers.lars import LARS
from keras_largebatch.optimizers.lars_mixed import LARSMixed
from keras_largebatch.optimizers.lamb import LAMB
from keras_largebatch.optimizers.lamb_mixed import LAMBMixed
