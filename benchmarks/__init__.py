"""Side-by-side benchmarks of the trainers; run from the repository root as modules:
`python -m benchmarks.run`, `python -m benchmarks.gpu.trainer_figures`.
Importing the package does nothing."""
