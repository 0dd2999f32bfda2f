"""The trainer's library: everything around the training engine (utils.py) that the entry
points (main.py and its ports) use. Sweeps and search, which use the trainer, are sweeps/.

Three layers, each a package that imports only from the layers below it:

  run/    the parts of one run: its flags, data, loaders, device, checkpoints and run folder,
          schedule, log, divergence guard, and its life as a process (launch)
  ports/  what the ports ask of the libraries they adapt: Horovod (hvd_port), torch.distributed
          (process_group), torch's SGD without its compiler (eager_sgd)
  base/   what every layer uses: the errors a user sees, safe file writes, tensor layout, the
          training recipes

Each package's docstring lists its modules. Importing a package imports nothing else.
"""
