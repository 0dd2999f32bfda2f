"""The trainer's library: everything around the training engine (utils.py) that the entry
points (main.py and its ports) use. One concern a module:

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
  divergence   the guard that stops a run whose numbers stop being finite
  errors       the failures a user sees as one line
  launch       a process's rank before init, stop signals, one-line exits
  process_group  the DDP port's process group, joined and left whole
  eager_sgd    torch's SGD, started without importing torch's compiler
  hvd_port     what the Horovod ports ask of Horovod: its CUDA settings, how the gradients
               reach it and their compression, Adasum's limits and LR scale
  groups       one MPI job as groups of processes, each training a Horovod run at a time
  run_queue    the queue of a sweep's runs, which groups take from
  headed       lines headed by their run, for runs printing side by side
  sweep        main_sweep.py --sweep: a grid of runs as one MPI job, queued on groups
  sweep_report what a sweep reports: sweep.csv, the table, sweep.png
  search       main_sweep.py --search: an Optuna study over the groups, with pruning
  search_report  what a search reports: search.csv, the best trials, search.png

Importing the package imports nothing else.
"""
