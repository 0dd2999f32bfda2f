"""The trainer's library: everything around the training engine (utils.py) that the entry
points (main.py and its ports) use; sweeps and search, which use the trainer, are sweeps/. One
concern a module:

  cli          the flags, their defaults and checks
  recipe       the training recipes the defaults come from
  schedule     the learning rate as a function of the epoch
  data         CIFAR-10 on disk: download, synthetic data, loading
  loaders      which samples each rank sees, and the batches
  layout       channels_last, and the contiguous views collectives need
  devices      a process's GPU or share of the CPU cores, and a sweep process's share of its host
  checkpoints  what a run saves, every save of it, and where a run starts
  safeio       files never seen half-written, and folder locks
  runlog       what a run reports: lines, metrics.csv, TensorBoard, curves
  phases       the step's phases timed (--profile-steps)
  divergence   the guard that stops a run whose numbers stop being finite
  errors       the failures a user sees as one line
  launch       a process's rank before init, stop signals, one-line exits
  process_group  the DDP port's process group, joined and left whole
  eager_sgd    torch's SGD, started without importing torch's compiler
  hvd_port     what the Horovod ports ask of Horovod: its CUDA settings, how the gradients
               reach it and their compression, Adasum's limits and LR scale

Importing the package imports nothing else.
"""
