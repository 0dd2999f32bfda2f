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


# ---------------------------------------------------------------------------
# The device-resident loader against the torchvision path

def _tiny(n=90):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g), torch.arange(n) % 10


@pytest.mark.parametrize("size", [1, 3])
def test_device_and_torchvision_loaders_partition_alike(size):
    images, labels = _tiny()
    for rank in range(size):
        dev = data.DeviceLoader(images, labels, 16, train=True, rank=rank, size=size, seed=7)
        tv = data.torchvision_loader(images, labels, 16, train=True, rank=rank, size=size, seed=7, workers=0)
        for epoch in (0, 1):
            dev.set_epoch(epoch)
            tv.set_epoch(epoch)
            assert dev.indices().tolist() == list(tv.sampler)
        dev_test = data.DeviceLoader(images, labels, 16, train=False, rank=rank, size=size)
        tv_test = data.torchvision_loader(images, labels, 16, train=False, rank=rank, size=size, workers=0)
        assert dev_test.indices().tolist() == list(tv_test.sampler)


def test_device_loader_batches_are_reproducible_per_epoch():
    images, labels = _tiny()
    a = data.DeviceLoader(images, labels, 32, train=True, seed=1)
    b = data.DeviceLoader(images, labels, 32, train=True, seed=1)
    a.set_epoch(4)
    b.set_epoch(4)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    b.set_epoch(5)
    assert not torch.equal(next(iter(a))[0], next(iter(b))[0])


def test_crop_and_flip_match_pad_slice_and_mirror():
    images, _ = _tiny(12)
    offsets = torch.tensor([[0, 0], [8, 8], [4, 4], [0, 8], [8, 0], [3, 5]] * 2)
    flips = torch.tensor([False] * 6 + [True] * 6)
    out = data.crop_flip(images, offsets, flips)
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    for i in range(12):
        oy, ox = offsets[i].tolist()
        want = padded[i, :, oy:oy + 32, ox:ox + 32]
        assert torch.equal(out[i], want.flip(-1) if flips[i] else want)


@pytest.mark.parametrize("shape", [(3, 32, 32), (3, 5, 7)])
def test_device_loader_batches_are_crop_flip_of_its_draws(shape):
    # The loader reads crops from a strided view of padded and mirrored copies; the
    # batches must be exactly crop_flip of the drawn offsets and flips, normalised.
    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (40, *shape), dtype=torch.uint8, generator=g)
    labels = torch.arange(40) % 10
    loader = data.DeviceLoader(images, labels, 16, train=True, rank=1, size=2, seed=5)
    loader.set_epoch(2)
    offsets, flips = loader.augmentation()
    assert flips.any() and not flips.all() and (offsets[:, 1] != 4).any()
    idx = loader.indices()
    batches = list(loader)
    assert [len(y) for _, y in batches] == [16, 4]
    x = torch.cat([xb for xb, _ in batches])
    want = data.crop_flip(images[idx], offsets[idx], flips[idx])
    assert torch.equal(x, (want.float() - loader.mean) / loader.std)
    assert torch.equal(torch.cat([yb for _, yb in batches]), labels[idx])


def test_augmentation_statistics():
    n = 9000
    loader = data.DeviceLoader(torch.zeros(n, 3, 1, 1, dtype=torch.uint8), torch.zeros(n, dtype=torch.long),
                               64, train=True, seed=0)
    offsets, flips = loader.augmentation()
    for axis in (0, 1):
        counts = torch.bincount(offsets[:, axis], minlength=9).double()
        assert offsets[:, axis].min() == 0 and offsets[:, axis].max() == 8
        chi2 = (((counts - n / 9) ** 2) / (n / 9)).sum().item()
        assert chi2 < 26.1, f"offsets not uniform over 0..8 (chi2 {chi2:.1f}, 8 dof, p=0.001)"
    rate = flips.double().mean().item()
    assert abs(rate - 0.5) < 4 * (0.25 / n) ** 0.5
    # Crop offsets in y and x, and flips, are independent draws.
    assert abs(torch.corrcoef(torch.stack([offsets[:, 0].double(), offsets[:, 1].double(),
                                           flips.double()]))[0, 1:]).max() < 0.05


def test_normalisation_uses_cifar_mean_and_std():
    images = torch.full((4, 3, 32, 32), 128, dtype=torch.uint8)
    x, _ = next(iter(data.DeviceLoader(images, torch.zeros(4, dtype=torch.long), 4, train=False)))
    want = (128 / 255 - torch.tensor(data.MEAN)) / torch.tensor(data.STD)
    assert torch.allclose(x[0, :, 0, 0], want, atol=1e-5)
