"""The set-up (setup.sh, `make setup`), the scripts of the local clusters, and beside them the
GPU check, run from the repository root as a module: `python3 -m scripts.gpu_check` (`make
gpu-check`). Importing the package does nothing."""
