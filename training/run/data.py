"""CIFAR-10 on disk and in memory: the reader, the synthetic generator, the download,
and preparing a data folder once however many processes ask. The loaders that turn
the arrays into batches are in loaders.py.

Every entry point reads data through this module. It is kept apart from utils.py
because it is the one piece a user swaps (another dataset, another loader),
and because the benchmarks import it on its own.

On disk, real and synthetic data share one format, the `cifar-10-batches-py`
layout: `data_batch_1..5`, `test_batch` and `batches.meta`, each a pickled dict
whose `data` is uint8 N x 3072 (the R, G and B planes of a 32x32 image) and
whose `labels` is a list of ints.
"""
import functools
import os
import pickle
import shutil
import tempfile

import numpy as np
import torch

from training.base.errors import TrainerError, UsageError
from training.base.safeio import atomic_write, once

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
           "dog", "frog", "horse", "ship", "truck")
# The usual per-channel statistics of the CIFAR-10 training set.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


# ----------------------------------------------------------------------------
# Reading: the same code for real and synthetic data.

class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists and numpy arrays, and refuses everything else.

    The batch files are pickles; this keeps a tampered file from running code.
    """
    _ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_batch(path):
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="latin1").load()
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch.get("labels", batch.get("fine_labels")), dtype=np.int64)
    except Exception as e:  # truncated, corrupt or foreign file
        raise TrainerError(f"corrupt CIFAR batch file {path} ({type(e).__name__}: {e}); "
                           "delete it and run again with --download "
                           "(or --dataset synthetic to regenerate)") from e
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise TrainerError(f"corrupt CIFAR batch file {path}: expected data N x 3072 and N labels, "
                           f"got data {data.shape} and {len(labels)} labels; "
                           "delete it and regenerate")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise TrainerError(f"corrupt CIFAR batch file {path}: labels outside 0..9")
    return data, labels


def read_cifar10(folder):
    """Read a `cifar-10-batches-py` folder into ((train_x, train_y), (test_x, test_y)).

    Images come back as uint8 tensors of shape N x 3 x 32 x 32, labels as int64.
    """
    missing = _missing(folder)
    if missing:
        raise FileNotFoundError(f"{folder}: missing {', '.join(missing)}")
    parts = [_read_batch(os.path.join(folder, f)) for f in TRAIN_FILES]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = _read_batch(os.path.join(folder, TEST_FILE))

    def as_tensors(x, y):
        return torch.from_numpy(x.reshape(-1, 3, 32, 32).copy()), torch.from_numpy(y.copy())

    return as_tensors(train_x, train_y), as_tensors(test_x, test_y)


# ----------------------------------------------------------------------------
# Synthetic data: CIFAR-format files with class structure a small CNN learns.

def _render(rng, labels):
    """Images whose class shows in colour, stripe frequency and stripe angle.

    Every cue is jittered per image and overlaps between classes, with noise on
    top, so colour alone is not enough and accuracy climbs over epochs instead
    of jumping to 100%. Phase is random, so a random crop keeps the class.
    """
    n = len(labels)
    palette = np.random.default_rng(1234).uniform(0.2, 0.8, size=(10, 3))
    freq = np.linspace(0.15, 0.6, 10)[np.random.default_rng(99).permutation(10)]
    angle = np.linspace(0, np.pi, 10, endpoint=False)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    colour = palette[labels] + rng.normal(0, 0.12, size=(n, 3))
    f = freq[labels] * rng.uniform(0.85, 1.15, size=n)
    a = angle[labels] + rng.normal(0, 0.12, size=n)
    phase = rng.uniform(0, 2 * np.pi, size=n)
    proj = (np.cos(a)[:, None, None] * xx + np.sin(a)[:, None, None] * yy)
    stripes = np.sin(f[:, None, None] * proj + phase[:, None, None])  # n x 32 x 32
    contrast = rng.uniform(0.15, 0.3, size=(n, 1, 1, 1))
    img = (colour[:, :, None, None] + contrast * stripes[:, None]
           + rng.normal(0, 0.08, size=(n, 3, 32, 32)))
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8).reshape(n, 3072)


def _write_pickle(path, obj):
    atomic_write(path, lambda f: pickle.dump(obj, f, protocol=2),
                 hint="free space or fix permissions in --data-dir, then run again")


def check_synthetic_size(train_size):
    """The training set is split evenly over the 5 batch files."""
    if train_size < 5 or train_size % 5:
        raise UsageError(f"--synthetic-size must be a positive multiple of 5 (got {train_size}): "
                         "it is split over 5 batch files")


def generate_synthetic(folder, train_size, test_size, seed):
    """Write a synthetic dataset in the CIFAR-10 on-disk format, deterministically from seed."""
    check_synthetic_size(train_size)
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = train_size // 5
    for name, n in [(f, per_file) for f in TRAIN_FILES] + [(TEST_FILE, test_size)]:
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        _write_pickle(os.path.join(folder, name), {
            "batch_label": f"synthetic {name}", "labels": labels.tolist(),
            "data": _render(rng, labels),
            "filenames": [f"synthetic_{name}_{i}.png" for i in range(n)]})
    _write_pickle(os.path.join(folder, META_FILE), {
        "num_cases_per_batch": per_file, "label_names": list(CLASSES), "num_vis": 3072})


def synthetic_folder(data_dir, train_size, seed):
    """Where synthetic data of this size and seed lives, apart from any real data."""
    return os.path.join(data_dir, f"synthetic-{train_size}-seed{seed}", FOLDER)


def dataset_folder(args):
    if args.dataset == "synthetic":
        return synthetic_folder(args.data_dir, args.synthetic_size, args.seed)
    return os.path.join(args.data_dir, FOLDER)


def prepare(args):
    """Make the data exist on disk: generate synthetic data, or download real CIFAR-10.
    Returns whether this process did it.

    Any number of processes, on one host or on several sharing --data-dir, may call this
    at once: the work runs once, under a lock file beside the data, while the others
    wait and then find it done (safeio.once), and every file is renamed into place whole.
    """
    folder = dataset_folder(args)
    if args.dataset == "synthetic":
        work = functools.partial(generate_synthetic, folder, args.synthetic_size,
                                 args.synthetic_size // 5, args.seed)
        done = functools.partial(os.path.isfile, os.path.join(folder, META_FILE))  # written last
    elif args.download:
        work, done = (functools.partial(download_cifar10, args.data_dir),
                      lambda: not _missing(folder))
    else:
        load_check(folder)
        return False
    lock = os.path.join(os.path.dirname(folder), f".{FOLDER}.lock")
    return once(lock, done, work, hint="fix the permissions of --data-dir or choose another")


def download_cifar10(data_dir):
    """Fetch CIFAR-10 through torchvision, which checks the archive's MD5. The archive stays
    in data_dir for later calls; it is extracted beside, then each file renamed into place."""
    import torchvision  # only needed to fetch
    from torchvision.datasets.utils import download_and_extract_archive
    cifar = torchvision.datasets.CIFAR10
    try:
        os.makedirs(os.path.join(data_dir, FOLDER), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".extract-", dir=data_dir)
        try:
            download_and_extract_archive(cifar.url, data_dir, tmp, cifar.filename, cifar.tgz_md5)
            for name in os.listdir(os.path.join(tmp, cifar.base_folder)):
                os.replace(os.path.join(tmp, cifar.base_folder, name),
                           os.path.join(data_dir, FOLDER, name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception as e:
        raise TrainerError(f"could not download CIFAR-10 into {data_dir} ({e}); "
                           f"put the extracted {FOLDER} there by hand, "
                           "or use --dataset synthetic") from e


def _missing(folder):
    return [f for f in TRAIN_FILES + [TEST_FILE] if not os.path.isfile(os.path.join(folder, f))]


def load_check(folder, synthetic=False):
    """Raise the one-line error for a dataset folder with files missing."""
    missing = _missing(folder)
    if not missing:
        return
    if synthetic:
        raise TrainerError(f"synthetic data in {folder} is incomplete "
                           f"(missing {', '.join(missing)}); "
                           "delete that folder and run again to regenerate it")
    raise TrainerError(f"CIFAR-10 not found in {folder} (missing {', '.join(missing)}); "
                       "pass --download to fetch it, or --data-dir to point at it")


def load(args):
    """Read the prepared dataset: ((train_x, train_y), (test_x, test_y))."""
    folder = dataset_folder(args)
    load_check(folder, synthetic=args.dataset == "synthetic")
    return read_cifar10(folder)
