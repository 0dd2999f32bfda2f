"""Host syncs in the training loop on CUDA, counted by PyTorch's sync debug mode.

    python -m benchmarks.gpu.host_syncs main.py --amp --epochs 2 ...
    HOROVOD_ELASTIC=1 horovodrun -np 1 --gloo python -m benchmarks.gpu.host_syncs main_horovod.py --amp ...

Runs the named trainer's main() in this process with the given flags. Around every
call of utils.train_epoch, torch.cuda.set_sync_debug_mode("warn") makes each operation
that waits for the GPU (a value read back, a blocking copy) warn; the warnings are
counted. It prints one JSON line per epoch: steps, syncs, and where the most frequent
ones were raised (file:line and the warning). A step loop
that never waits has the same count at every epoch length; one that waits once a
step has as many more as it has steps. The CPU has no such mode: it exits 1 there.
"""
import collections
import importlib
import json
import os
import sys
import warnings

import torch

import utils


def counting(train_epoch, epochs):
    def counted(model, loader, *args, **kwargs):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = train_epoch(model, loader, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in seen if "synchroniz" in str(w.message)]
        where = collections.Counter(f"{os.path.relpath(w.filename)}:{w.lineno}: {str(w.message)[:80]}"
                                    for w in syncs)
        epochs.append({"steps": len(loader), "syncs": len(syncs), "where": dict(where.most_common(6))})
        return out
    return counted


def main(argv):
    if not torch.cuda.is_available():
        print("benchmarks.gpu.host_syncs: counts CUDA syncs and needs a CUDA GPU", file=sys.stderr)
        return 1
    script, flags = argv[0], argv[1:]
    epochs = []
    utils.train_epoch = counting(utils.train_epoch, epochs)
    trainer = importlib.import_module(script.removesuffix(".py"))
    trainer.main(flags)
    for n, e in enumerate(epochs):
        print(json.dumps({"script": script, "epoch": n + 1, **e}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
