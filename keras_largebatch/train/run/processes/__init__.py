"""Several processes: JAX's `keras.distribution` (`jax_cluster`), torch's
`torchrun` (`torch_cluster`), and the supervisor that runs each JAX
process's command in a child and names a lost one (`supervisor`)."""
