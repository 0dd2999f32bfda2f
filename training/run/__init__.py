"""The parts of one run, which the engine (utils.py) and the entry points put together; each
imports only from this package and base/:

  cli          the flags, their defaults and checks
  data         CIFAR-10 on disk: download, synthetic data, loading
  loaders      which samples each rank sees, and the batches
  devices      a process's GPU or share of the CPU cores, and a sweep process's share of its host
  schedule     the learning rate as a function of the epoch
  checkpoints  what a run saves, every save of it, and where a run starts
  rundir       the run folder: checked before a run, held by one run at a time
  runlog       what a run reports: lines, metrics.csv, TensorBoard, curves.svg
  curves       curves.svg, the run's charts, drawn without a plotting library
  tracking     the run in MLflow (--mlflow), continued across restarts
  sender       the thread that sends the run's MLflow requests, off the training path
  phases       the step's phases timed (--profile-steps)
  divergence   the guard that stops a run whose numbers stop being finite
  launch       a process's rank before init, stop signals, one-line exits
"""
