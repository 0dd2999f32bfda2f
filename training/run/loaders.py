"""Batches: which samples each rank sees, and the loaders that serve them.

`DeviceLoader` (the default) keeps the uint8 dataset on the training device and
augments a whole batch with one gather; `torchvision_loader` is pytorch-cifar's
pipeline (PIL transforms in worker processes), kept for comparison and for users
who swap in their own transforms. Both shard with DistributedSampler's semantics:
at every step the ranks' batches together are the global batch of one process.
"""
import math

import torch

from training.run.data import MEAN, STD

# ----------------------------------------------------------------------------
# Sharding: which samples each rank sees.

def epoch_permutation(n, seed, epoch):
    """The order of all n samples in an epoch, as DistributedSampler(seed=seed) draws it."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g)


def train_shard(n, rank, size, seed, epoch):
    """This rank's training indices for an epoch, with DistributedSampler's semantics.

    The shards are strided slices of one shuffled order, so at every step the
    ranks' batches together form the same global batch as one process taking
    size x the batch. When n does not divide by size, the order is padded with
    its own first samples (at most size-1 repeats) so that every rank takes the
    same number of steps; the allreduce in each step needs that.
    """
    order = epoch_permutation(n, seed, epoch)
    total = math.ceil(n / size) * size
    if total > n:  # repeated as often as it takes, for the rare world larger than twice n
        order = order.repeat(math.ceil(total / n))[:total]
    return order[rank:total:size]


def eval_shard(n, rank, size):
    """This rank's test indices: disjoint, no padding, so each image counts once. A rank
    beyond the last image has none, and counts nothing."""
    return torch.arange(rank, max(rank, n), size)


# ----------------------------------------------------------------------------
# The device-resident loader (the default).

class DeviceLoader:
    """Batches from a uint8 dataset held on the training device.

    No worker processes and no per-step host copies: each epoch a shard of
    indices is drawn, and augmentation (random crop from a `pad`-pixel zero pad, 4 in the
    recipes, horizontal flip) is one index_select per batch; `cutout` > 0 then zeroes a square
    of that side, wholly inside the image, in each normalized image. The random choices for each
    sample are a function of (seed, epoch, sample index), so a resumed run sees
    the same batches, and so does a run at another world size.

    For training, each process keeps the set padded and, beside it, padded and
    mirrored: at a pad of 4, 2 x 40 x 40 / (32 x 32) = 3.1 times the uint8 set, 480 MB for
    CIFAR-10's 50,000 images (built with one 150 MB temporary). A crop of a flipped
    image is then a window of the mirrored copy, and every window is a row of one
    strided view, so a batch is gathered with contiguous row copies instead of a per-pixel
    gather.
    """

    def __init__(self, images, labels, batch_size, *, train, rank=0, size=1, seed=0,
                 device="cpu", dtype=torch.float32, channels_last=False, pad=4, cutout=0):
        self.pad = pad  # the trainers pass their recipe's crop_padding
        self.cutout = cutout if train else 0
        self.labels = labels.to(device)
        self.batch_size, self.train = batch_size, train
        self.rank, self.size, self.seed = rank, size, seed
        self.device, self.dtype, self.channels_last = torch.device(device), dtype, channels_last
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
        self.epoch = 0
        images = images.to(device)
        self.shape = tuple(images.shape[1:])
        if train:
            self.images = None
            self.windows = crop_windows(images, self.pad)
        else:
            self.images = images

    def set_epoch(self, epoch):
        self.epoch = epoch

    def indices(self):
        n = len(self.labels)
        if self.train:
            return train_shard(n, self.rank, self.size, self.seed, self.epoch)
        return eval_shard(n, self.rank, self.size)

    def __len__(self):
        return math.ceil(len(self.indices()) / self.batch_size)

    def augmentation(self):
        """Per-sample crop offsets (0..2 pad in y and x), flips and cutout corners (None without
        cutout) for this epoch."""
        g = torch.Generator()
        g.manual_seed(hash_seed(self.seed, self.epoch, 0xA06))
        n = len(self.labels)
        offsets = torch.randint(0, 2 * self.pad + 1, (n, 2), generator=g)
        flips = torch.rand(n, generator=g) < 0.5
        corners = None
        if self.cutout:  # drawn after the others, which stay what they were without it
            corners = torch.randint(0, self.shape[1] - self.cutout + 1, (n, 2), generator=g)
            corners = corners.to(self.device)
        return offsets.to(self.device), flips.to(self.device), corners

    def window_starts(self, offsets, flips):
        """Row of self.windows holding each sample's crop: the crop at (oy, ox) of a flipped
        image is the mirrored copy's window at x offset 2*pad - ox."""
        n = len(self.labels)
        c, h, w = self.shape
        hp, wp = h + 2 * self.pad, w + 2 * self.pad
        ox = torch.where(flips, 2 * self.pad - offsets[:, 1], offsets[:, 1])
        image = torch.arange(n, device=self.device) + flips.long() * n
        return image * (c * hp * wp) + offsets[:, 0] * wp + ox

    def __iter__(self):
        idx = self.indices().to(self.device)
        rows = corners = None
        if self.train:
            offsets, flips, corners = self.augmentation()
            source, rows = self.windows, self.window_starts(offsets, flips)
        else:
            source = self.images
        for start in range(0, len(idx), self.batch_size):
            b = idx[start:start + self.batch_size]
            x = torch.index_select(source, 0, b if rows is None else rows[b])
            cut = None if corners is None else corners[b]
            yield self.normalize(x, cut), torch.index_select(self.labels, 0, b)

    def normalize(self, x, corners=None):
        x = x.float().sub_(self.mean).div_(self.std)
        if corners is not None:  # zero each image's cutout square (the mean colour, normalized)
            side, (h, w) = self.cutout, x.shape[-2:]
            ys = torch.arange(h, device=x.device).view(1, 1, h, 1) - corners[:, 0].view(-1, 1, 1, 1)
            xs = torch.arange(w, device=x.device).view(1, 1, 1, w) - corners[:, 1].view(-1, 1, 1, 1)
            x.masked_fill_((ys >= 0) & (ys < side) & (xs >= 0) & (xs < side), 0.0)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.to(self.dtype)


def crop_windows(images, pad):
    """Every pad-crop window of the padded images and of their mirror images, as a
    strided view: row r is the C x H x W window whose first element is element r of
    [padded images, padded mirrored images] laid out flat. Rows overlap; the view
    only reads."""
    n, c, h, w = images.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    store = torch.zeros(2 * n, c, hp, wp, dtype=images.dtype, device=images.device)
    store[:n, :, pad:pad + h, pad:pad + w] = images
    store[n:, :, pad:pad + h, pad:pad + w] = images.flip(-1)  # the mirror of a padded image
    extent = (c - 1) * hp * wp + (h - 1) * wp + w  # elements a window spans
    return torch.as_strided(store, (store.numel() - extent + 1, c, h, w), (1, hp * wp, wp, 1))


def hash_seed(*parts):
    """A 63-bit seed from integers, stable across runs (unlike hash())."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) * 0x100000001B3 & 0xFFFFFFFFFFFFFFFF
    return h >> 1


# ----------------------------------------------------------------------------
# The classic torchvision path, kept for comparison (--loader torchvision).

class _PILDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels, transform):
        self.images = images.permute(0, 2, 3, 1).contiguous().numpy()  # N x H x W x C for PIL
        self.labels = labels.tolist()
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image
        return self.transform(Image.fromarray(self.images[i])), self.labels[i]


class _StridedSampler(torch.utils.data.Sampler):
    def __init__(self, n, rank, size):
        self.idx = eval_shard(n, rank, size).tolist()

    def __iter__(self):
        return iter(self.idx)

    def __len__(self):
        return len(self.idx)


def torchvision_loader(images, labels, batch_size, *, train, rank=0, size=1, seed=0, workers=2,
                       pad=4):
    """kuangliu's PIL pipeline with a DistributedSampler (call set_epoch on .sampler)."""
    import torchvision.transforms as T
    ops = [T.RandomCrop(32, padding=pad), T.RandomHorizontalFlip()] if train else []
    transform = T.Compose(ops + [T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = _PILDataset(images, labels, transform)
    if train:
        sampler = torch.utils.data.distributed.DistributedSampler(
            ds, num_replicas=size, rank=rank, shuffle=True, seed=seed)
    else:
        sampler = _StridedSampler(len(ds), rank, size)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler,
                                         num_workers=workers,
                                         persistent_workers=workers > 0)
    loader.set_epoch = sampler.set_epoch if train else (lambda epoch: None)
    return loader
