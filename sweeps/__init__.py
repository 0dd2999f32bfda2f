"""Sweeps and search: an application built on the trainer. main_sweep.py runs one MPI job as
groups of processes, each group training ordinary main_horovod.py runs (main_horovod.main) one
after another. One concern a module:

  flags        main_sweep.py's flags: --sweep and --search's grammar and checks, a run's flags
  sweep        --sweep: a grid of runs, queued on the groups
  search       --search: an Optuna study over the groups, with pruning
  groups       one MPI job as groups of processes, each training a Horovod run at a time, and
               the job's course (run_job), which a grid and a study each say (Job)
  run_queue    the queue of a sweep's runs, which groups take from
  placement    each process's share of its host (its cores, its GPU), before any run
  headed       lines headed by their run, for runs printing side by side
  report       what a sweep and a search report: their CSV, table and PNG

It imports the trainer's library (training/), never the other way round. Importing the package
imports nothing else.
"""
