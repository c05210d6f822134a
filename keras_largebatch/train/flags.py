"""Command-line flags of `keras-largebatch-train` (absl, Model Garden style).

The defaults are the embedded default run: AlexNet-BN at its minimum input
(67x67) on scikit-learn's digits, batch 32, LARSMixed with warmup and
polynomial decay, 6 epochs, a few minutes on a 2-core CPU.
"""

from absl import flags

MODELS = ("alexnet_bn", "resnet50", "resnet50_v1_5", "resnet_cifar")
DATASETS = (
    "digits",
    "directory",
    "tfrecord",
    "synthetic",
    "mnist",
    "fashion_mnist",
    "cifar10",
    "cifar100",
)
OPTIMIZERS = ("lars_mixed", "lars", "lamb_mixed", "lamb", "sgd")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
DISTRIBUTIONS = ("none", "multi_worker", "data_parallel")

FLAGS = flags.FLAGS


def define_flags():
    """Defines the flags once (absl flags are process-global)."""
    if "model" in FLAGS:
        return
    flags.DEFINE_enum(
        "model", "alexnet_bn", MODELS,
        "Architecture; resnet_cifar is He et al.'s CIFAR ResNet "
        "(--resnet_depth, --resnet_width), for CPU-scale studies.")
    flags.DEFINE_integer(
        "resnet_depth", 20, "resnet_cifar: depth 6n + 2 (8, 14, 20, ...).")
    flags.DEFINE_integer(
        "resnet_width", 16, "resnet_cifar: channels of the first stage.")
    flags.DEFINE_enum(
        "dataset", "digits", DATASETS,
        "digits: embedded (scikit-learn, no download); directory: class "
        "subfolders under --data_dir (with train/ and validation/ or split "
        "80/20); tfrecord: ImageNet-format train-*/validation-* files in "
        "--data_dir; synthetic: random images, for throughput; the others: "
        "keras.datasets (download once).",
    )
    flags.DEFINE_string("data_dir", None, "Data for directory and tfrecord.")
    flags.DEFINE_enum(
        "input_pipeline", "auto", ("auto", "tf_data", "grain"),
        "grain: Grain and NumPy, no TensorFlow (in-memory data sets, class "
        "folders); tf_data: tf.data (every data set; needs TensorFlow). "
        "auto: tf_data on the TensorFlow backend and for tfrecord, grain "
        "elsewhere.")
    flags.DEFINE_integer(
        "num_classes", 0,
        "Classes for tfrecord (default 1000) and synthetic (default 10); "
        "inferred elsewhere.",
    )
    flags.DEFINE_integer(
        "num_train_examples", 0,
        "tfrecord: training examples (steps per epoch); 0: from index.json "
        "in --data_dir (python -m keras_largebatch.train.imagenet DIR "
        "writes it) or ImageNet's 1,281,167. Nothing is counted at start.")
    flags.DEFINE_integer(
        "num_validation_examples", 0,
        "tfrecord: validation examples; 0: index.json or ImageNet's 50,000.")
    flags.DEFINE_integer(
        "image_size", 0,
        "Square input size; 0 means 67 for alexnet_bn (its minimum), 32 "
        "for resnet50, and the data set's own size for resnet_cifar.",
    )
    flags.DEFINE_integer("global_batch_size", 32, "Batch over all replicas.")
    flags.DEFINE_float(
        "base_learning_rate", 0.0,
        "Rate at --base_batch_size, scaled by --lr_scaling to the global "
        "batch; 0 means 0.1 for sgd, 2.0 for lars and lars_mixed, 0.002 for "
        "lamb and lamb_mixed. Not used by --lr_scaling=mlperf.",
    )
    flags.DEFINE_integer("base_batch_size", 256, "Batch of the base rate.")
    flags.DEFINE_enum(
        "lr_scaling", "auto", ("auto", "mlperf", "linear", "sqrt", "none"),
        "The peak rate: mlperf is MLPerf's LARS table by global batch (10 "
        "below 16K, 25 below 32K, 31.2 above; 10 * sqrt(batch / 4096) below "
        "4096); linear (Goyal et al.) and "
        "sqrt scale --base_learning_rate; none uses it as the peak. auto: "
        "mlperf for lars and lars_mixed, linear for sgd, sqrt for lamb and "
        "lamb_mixed.",
    )
    flags.DEFINE_float(
        "warmup_epochs", None,
        "Linear warmup length; default: the rule's fraction of --epochs "
        "(mlperf: 5/42 below a global batch of 32K, 25/90 above; linear: "
        "5/90).")
    flags.DEFINE_float("end_learning_rate", 1e-4, "Rate after decay.")
    flags.DEFINE_float("poly_power", 2.0, "Power of the polynomial decay.")
    flags.DEFINE_integer("epochs", 6, "Training epochs.")
    flags.DEFINE_integer(
        "steps_per_epoch", 0, "Limit steps per epoch (0: whole data set).")
    flags.DEFINE_integer(
        "gradient_accumulation_steps", 1,
        "Batches of --global_batch_size / N whose gradients are averaged "
        "before each update: a large batch on a small machine (batch norm "
        "then sees each batch of global / N, as on a cluster each replica "
        "does).")
    flags.DEFINE_enum("optimizer", "lars_mixed", OPTIMIZERS, "Optimizer.")
    flags.DEFINE_float("momentum", 0.9, "Momentum.")
    flags.DEFINE_float("eta", 0.001, "LARS trust coefficient.")
    flags.DEFINE_float(
        "weight_decay", 5e-4, "L2 decay on kernels (never biases or BN).")
    flags.DEFINE_enum(
        "precision", "auto", PRECISIONS,
        "auto: mixed_float16 on a GPU, float32 on a CPU.",
    )
    flags.DEFINE_float("label_smoothing", 0.0, "Label smoothing.")
    flags.DEFINE_float(
        "bn_momentum", 0.9,
        "Batch-norm moving-average momentum (0.9 as in MLPerf's ResNet; "
        "Keras' 0.99 lags behind in runs of a few hundred steps).",
    )
    flags.DEFINE_integer(
        "precise_bn_batches", 0,
        "Before each evaluation (and in --mode=eval), set batch norm's "
        "statistics to their average over this many training batches "
        "(Goyal et al.'s precise BN); 0: the moving averages. Not with "
        "--distribution=multi_worker.",
    )
    flags.DEFINE_boolean(
        "gradient_noise_scale", False,
        "Log the gradient noise scale B_simple (McCandlish et al.) each "
        "epoch and say at the end what it means for the batch; needs "
        "--gradient_accumulation_steps >= 2 or several replicas.")
    flags.DEFINE_enum(
        "augment", "auto", ("auto", "none", "light", "crop_flip"),
        "auto: light (shift/zoom, no flip) for digit data sets, crop_flip "
        "for photos.",
    )
    flags.DEFINE_string("model_dir", None, "Outputs and checkpoints.")
    flags.DEFINE_enum(
        "mode", "train", ("train", "eval"),
        "eval: evaluate the latest checkpoint in --model_dir on the "
        "validation set and write eval.json; flags not given are the run's.")
    flags.DEFINE_integer(
        "keep_checkpoints", 2,
        "Epoch checkpoints kept in model_dir/checkpoints, the final model "
        "(epoch_NNN.keras, also model_dir/final.keras) counting as the "
        "newest; 0 keeps none, and final.keras is still written.")
    flags.DEFINE_string(
        "init_weights", None,
        "A .weights.h5 or .keras (e.g. another run's final.keras) of the "
        "same architecture; the classifier is skipped "
        "when the number of classes differs (fine-tuning).",
    )
    from keras_largebatch import distribute

    flags.DEFINE_integer(
        "fusion_threshold_bytes", distribute.FUSION_THRESHOLD_BYTES,
        "multi_worker: capacity of a gradient fusion bucket (0: one "
        "all-reduce per tensor).",
    )
    flags.DEFINE_integer(
        "hierarchical_threshold_bytes", distribute.HIERARCHICAL_THRESHOLD_BYTES,
        "multi_worker: buckets smaller than this go hierarchical when the "
        "job spans several nodes (0: never).",
    )
    flags.DEFINE_enum(
        "compression", "none", ("none", "fp16", "topk"),
        "multi_worker: fp16 sends float32 gradients as float16 (best with "
        "lars_mixed, whose gradients travel loss-scaled); topk sends the "
        "--topk_density largest entries of each bucket with error feedback "
        "(for slow networks; see docs/distributed.md).",
    )
    flags.DEFINE_float(
        "topk_density", 0.01,
        "multi_worker, --compression=topk: fraction of each gradient bucket "
        "a worker sends, in (0, 1]; the rest is kept as a residual "
        "(checkpointed per worker under backup/topk_residuals).",
    )
    flags.DEFINE_integer(
        "workers_per_node", 0,
        "multi_worker: consecutive tasks per node (0: tasks sharing a host).",
    )
    flags.DEFINE_float(
        "collective_timeout_seconds", 0.0,
        "multi_worker: a collective waiting longer fails the job (0: no "
        "limit).",
    )
    flags.DEFINE_enum(
        "distribution", "none", DISTRIBUTIONS,
        "multi_worker: keras_largebatch.distribute with TF_CONFIG "
        "(TensorFlow); data_parallel: keras.distribution over local devices "
        "(JAX).",
    )
    flags.DEFINE_integer(
        "seed", 0,
        "Seed for splits, init, data order, augmentation and dropout: the "
        "same seed and flags give the same weights (see --deterministic).")
    flags.DEFINE_boolean(
        "deterministic", False,
        "TensorFlow backend: tf.config.experimental.enable_op_determinism() "
        "(slower kernels), needed for bit-identical runs there. JAX and "
        "torch on a CPU are deterministic without it.")
    flags.DEFINE_integer(
        "verbose", None,
        "Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per "
        "epoch; default: 1 on a terminal, 2 when stdout is not one.")
    flags.DEFINE_boolean(
        "check_images", True,
        "Decode every image of a directory data set before training, so "
        "a corrupt file fails fast.",
    )
