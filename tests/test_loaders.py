"""loaders.py: sharding, the device-resident loader, and the torchvision path it replaces."""
import pytest
import torch

from training.run import data, loaders


@pytest.mark.parametrize("n,size", [(100, 1), (100, 2), (101, 3), (10000, 7)])
def test_train_shards_cover_the_data_and_match_distributed_sampler(n, size):
    shards = [loaders.train_shard(n, r, size, seed=5, epoch=2) for r in range(size)]
    assert len({len(s) for s in shards}) == 1, "every rank takes the same number of samples"
    union = torch.cat(shards)
    assert set(union.tolist()) == set(range(n))
    assert len(union) - n < size  # padding repeats fewer than size samples
    ds = list(range(n))
    for r in range(size):
        sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=size, rank=r, seed=5)
        sampler.set_epoch(2)
        assert list(sampler) == shards[r].tolist()
    assert not torch.equal(loaders.train_shard(n, 0, size, 5, 3), shards[0]), "a new order each epoch"


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_eval_shards_count_each_image_once(size):
    union = torch.cat([loaders.eval_shard(10000, r, size) for r in range(size)])
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
        dev = loaders.DeviceLoader(images, labels, 16, train=True, rank=rank, size=size, seed=7)
        tv = loaders.torchvision_loader(images, labels, 16, train=True, rank=rank, size=size, seed=7, workers=0)
        for epoch in (0, 1):
            dev.set_epoch(epoch)
            tv.set_epoch(epoch)
            assert dev.indices().tolist() == list(tv.sampler)
        dev_test = loaders.DeviceLoader(images, labels, 16, train=False, rank=rank, size=size)
        tv_test = loaders.torchvision_loader(images, labels, 16, train=False, rank=rank, size=size, workers=0)
        assert dev_test.indices().tolist() == list(tv_test.sampler)


def test_device_loader_batches_are_reproducible_per_epoch():
    images, labels = _tiny()
    a = loaders.DeviceLoader(images, labels, 32, train=True, seed=1)
    b = loaders.DeviceLoader(images, labels, 32, train=True, seed=1)
    a.set_epoch(4)
    b.set_epoch(4)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    b.set_epoch(5)
    assert not torch.equal(next(iter(a))[0], next(iter(b))[0])


def crop_flip(images, offsets, flips, pad=4):
    """The reference crop: pad, take the window at each offset, mirror where asked."""
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    h, w = images.shape[-2:]
    crops = [padded[i, :, oy:oy + h, ox:ox + w] for i, (oy, ox) in enumerate(offsets.tolist())]
    return torch.stack([c.flip(-1) if f else c for c, f in zip(crops, flips.tolist())])


@pytest.mark.parametrize("shape", [(3, 32, 32), (3, 5, 7)])
def test_device_loader_batches_are_crop_flip_of_its_draws(shape):
    # The loader reads crops from a strided view of padded and mirrored copies; the
    # batches must be exactly crop_flip of the drawn offsets and flips, normalised.
    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (40, *shape), dtype=torch.uint8, generator=g)
    labels = torch.arange(40) % 10
    loader = loaders.DeviceLoader(images, labels, 16, train=True, rank=1, size=2, seed=5)
    loader.set_epoch(2)
    offsets, flips, corners = loader.augmentation()
    assert corners is None  # no --cutout
    assert flips.any() and not flips.all() and (offsets[:, 1] != 4).any()
    idx = loader.indices()
    batches = list(loader)
    assert [len(y) for _, y in batches] == [16, 4]
    x = torch.cat([xb for xb, _ in batches])
    want = crop_flip(images[idx], offsets[idx], flips[idx])
    assert torch.equal(x, (want.float() - loader.mean) / loader.std)
    assert torch.equal(torch.cat([yb for _, yb in batches]), labels[idx])


def test_augmentation_statistics():
    n = 9000
    loader = loaders.DeviceLoader(torch.zeros(n, 3, 1, 1, dtype=torch.uint8), torch.zeros(n, dtype=torch.long),
                               64, train=True, seed=0)
    offsets, flips, corners = loader.augmentation()
    assert corners is None  # no --cutout
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
    x, _ = next(iter(loaders.DeviceLoader(images, torch.zeros(4, dtype=torch.long), 4, train=False)))
    want = (128 / 255 - torch.tensor(data.MEAN)) / torch.tensor(data.STD)
    assert torch.allclose(x[0, :, 0, 0], want, atol=1e-5)


def test_more_ranks_than_images():
    # Evaluation: a rank beyond the last image has an empty shard; every image counts once.
    assert [loaders.eval_shard(1, r, 3).tolist() for r in range(3)] == [[0], [], []]
    # Training: every rank takes as many steps as the others, even with fewer images than ranks.
    shards = [loaders.train_shard(2, r, 5, seed=0, epoch=0) for r in range(5)]
    assert [len(s) for s in shards] == [1] * 5 and set(torch.cat(shards).tolist()) == {0, 1}
    empty = loaders.DeviceLoader(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), torch.zeros(1, dtype=torch.long),
                                 8, train=False, rank=2, size=3)
    assert len(empty) == 0 and list(empty) == []


def test_cutout_zeroes_one_whole_square_per_image_and_leaves_the_rest():
    g = torch.Generator().manual_seed(4)
    images = torch.randint(1, 255, (40, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.arange(40) % 10
    plain = loaders.DeviceLoader(images, labels, 16, train=True, seed=2)
    cut = loaders.DeviceLoader(images, labels, 16, train=True, seed=2, cutout=8)
    for loader in (plain, cut):
        loader.set_epoch(3)
    corners = cut.augmentation()[2][cut.indices()]
    x0, x1 = torch.cat([x for x, _ in plain]), torch.cat([x for x, _ in cut])
    zeroed = (x0 != x1)
    assert zeroed.sum(dim=(1, 2, 3)).tolist() == [3 * 8 * 8] * 40  # one 8x8 square, all channels
    assert (x1[zeroed] == 0).all() and torch.equal(x0[~zeroed], x1[~zeroed])  # crops and flips kept
    for img, (cy, cx) in zip(zeroed, corners.tolist()):
        assert 0 <= cy <= 24 and 0 <= cx <= 24 and img[:, cy:cy + 8, cx:cx + 8].all()
    assert len({tuple(c) for c in corners.tolist()}) > 20  # placed at random
    again = loaders.DeviceLoader(images, labels, 16, train=True, seed=2, cutout=8)
    again.set_epoch(3)
    assert torch.equal(torch.cat([x for x, _ in again]), x1)  # a function of (seed, epoch): resumable
    test = loaders.DeviceLoader(images, labels, 16, train=False, cutout=8)
    assert torch.equal(torch.cat([x for x, _ in test]), (images.float() - test.mean) / test.std)
