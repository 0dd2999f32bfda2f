"""data.py: the CIFAR reader, the synthetic generator, sharding and the loaders."""
import os
import pickle

import numpy as np
import pytest
import torch

import data
from errors import TrainerError


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("synth") / data.FOLDER)
    data.generate_synthetic(folder, 200, 50, seed=3)
    return folder


def test_synthetic_files_have_the_cifar_layout_and_read_back(synth):
    assert sorted(os.listdir(synth)) == sorted(data.TRAIN_FILES + [data.TEST_FILE, data.META_FILE])
    with open(os.path.join(synth, "data_batch_2"), "rb") as f:
        raw = pickle.load(f, encoding="latin1")
    assert raw["data"].dtype == np.uint8 and raw["data"].shape == (40, 3072)
    assert len(raw["labels"]) == 40
    (tx, ty), (vx, vy) = data.read_cifar10(synth)
    assert tx.shape == (200, 3, 32, 32) and tx.dtype == torch.uint8 and vx.shape == (50, 3, 32, 32)
    # Train images 40..79 are data_batch_2, in order, planes R, G, B.
    assert torch.equal(tx[40:80].reshape(40, 3072), torch.from_numpy(raw["data"]))
    assert ty[40:80].tolist() == raw["labels"]
    assert sorted(set(ty.tolist())) == list(range(10))


def test_synthetic_is_deterministic_from_the_seed(synth, tmp_path):
    again = str(tmp_path / "a")
    other = str(tmp_path / "b")
    data.generate_synthetic(again, 200, 50, seed=3)
    data.generate_synthetic(other, 200, 50, seed=4)
    (a, _), _ = data.read_cifar10(again)
    (b, _), _ = data.read_cifar10(other)
    (s, _), _ = data.read_cifar10(synth)
    assert torch.equal(a, s) and not torch.equal(b, s)


def test_real_layout_is_read_by_the_same_reader(tmp_path):
    # A Python-2-style batch file (bytes values, latin1) as the real download has.
    folder = tmp_path / data.FOLDER
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": b"x", "labels": list(range(10)),
                         "data": rng.integers(0, 256, (10, 3072), dtype=np.uint8)}, f, protocol=2)
    (tx, ty), (vx, _) = data.read_cifar10(str(folder))
    assert tx.shape == (50, 3, 32, 32) and vx.shape == (10, 3, 32, 32)


def test_reader_refuses_pickled_code(tmp_path, synth):
    folder = tmp_path / data.FOLDER
    folder.mkdir()
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        (folder / name).write_bytes(open(os.path.join(synth, name), "rb").read())
    marker = tmp_path / "ran"
    (folder / "data_batch_3").write_bytes(pickle.dumps(Boom(str(marker))))
    with pytest.raises(TrainerError, match="corrupt CIFAR batch file .*data_batch_3"):
        data.read_cifar10(str(folder))
    assert not marker.exists()


class Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_truncated_batch_is_a_clear_error(tmp_path, synth):
    folder = tmp_path / data.FOLDER
    folder.mkdir()
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        blob = open(os.path.join(synth, name), "rb").read()
        (folder / name).write_bytes(blob[:100] if name == data.TEST_FILE else blob)
    with pytest.raises(TrainerError, match="test_batch"):
        data.read_cifar10(str(folder))


@pytest.mark.parametrize("n,size", [(100, 1), (100, 2), (101, 3), (10000, 7)])
def test_train_shards_cover_the_data_and_match_distributed_sampler(n, size):
    shards = [data.train_shard(n, r, size, seed=5, epoch=2) for r in range(size)]
    assert len({len(s) for s in shards}) == 1, "every rank takes the same number of samples"
    union = torch.cat(shards)
    assert set(union.tolist()) == set(range(n))
    assert len(union) - n < size  # padding repeats fewer than size samples
    ds = list(range(n))
    for r in range(size):
        sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=size, rank=r, seed=5)
        sampler.set_epoch(2)
        assert list(sampler) == shards[r].tolist()
    assert not torch.equal(data.train_shard(n, 0, size, 5, 3), shards[0]), "a new order each epoch"


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_eval_shards_count_each_image_once(size):
    union = torch.cat([data.eval_shard(10000, r, size) for r in range(size)])
    assert len(union) == 10000 and set(union.tolist()) == set(range(10000))
