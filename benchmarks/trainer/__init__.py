"""The figures that measure the trainer itself: its speed, its ports (Horovod, DDP) and their
scaling at np=2, its loaders and layout, its accuracy on real data, sweeps and searches, and what
tracking costs it. One module per figure, named by its id (its key in results.json), listed in
benchmarks/run.py's FIGURES. Importing the package does nothing."""
