"""The figures that check the scaling model (tools/scaling_model.py) and its emulator
(tools/emulate.py) against what they stand for: the real trainers, the allreduce probe, the
hierarchical and tree allreduces, and the GPU-cluster predictions. One module per figure, named
by its id (its key in results.json), listed in benchmarks/run.py's FIGURES; beside them what
these figures share: gpu_cluster.py (the GPU-cluster table), emulated_jobs.py (emulated jobs)
and dilated.py (a step read free of what dilation does not scale). Importing the package does
nothing."""
