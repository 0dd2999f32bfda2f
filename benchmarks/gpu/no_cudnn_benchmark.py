"""A trainer run with cuDNN's algorithm search off, as the trainer ran before it turned it on.

    python -m benchmarks.gpu.no_cudnn_benchmark main.py --arch resnet18 ...

Runs the named trainer's main() in this process with the given flags, with
torch.backends.cudnn.benchmark left False after devices.take_device sets it: cuDNN then takes its
heuristics' algorithm for each convolution instead of timing them. For the GPU figures that
compare the two (scripts/gpu_check.py).
"""
import importlib
import sys

import torch

from training.run import devices


def main(argv):
    take_device = devices.take_device

    def without_search(*args, **kwargs):
        device = take_device(*args, **kwargs)
        torch.backends.cudnn.benchmark = False
        return device
    devices.take_device = without_search
    importlib.import_module(argv[0].removesuffix(".py")).main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
