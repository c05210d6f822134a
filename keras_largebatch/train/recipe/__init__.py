"""The large-batch recipe, a module per part: the network and its input
size (`models`), the learning rate (`rates`: the scaling rules, warmup,
polynomial decay), the optimizer and the compiled model (`optimizers`) and
the numeric precision (`precision`)."""
