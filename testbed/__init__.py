"""What the tests and the benchmarks share to run the real trainers (env.py). Importing the
package does nothing."""
