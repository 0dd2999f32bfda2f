"""Figure loader_speedup: images/s of loaders.DeviceLoader over the torchvision PIL pipeline.

Same images, same batch, full epochs, each batch made training-ready on the
device. On the CPU the headline runs the DeviceLoader on one torch thread,
against the torchvision pipeline's two worker processes: the DeviceLoader gets
the smaller share of the machine. It is also timed with the trainer's thread
count (devices.share_cores: every usable core), recorded beside the headline.
"""
import os
import time

import torch

from benchmarks import harness
from training.run import data, loaders

NAME = "loader_speedup"
GOAL = (">=", 20.0)
DESCRIPTION = "DeviceLoader images/s over torchvision PIL pipeline (2 workers)"
FULL = dict(loader_images=10000, loader_batch=128, loader_repeats=5)
QUICK = dict(loader_images=1000, loader_batch=128, loader_repeats=2)
TORCHVISION = "torchvision, 2 workers"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loader(loader, device, epoch):
    """Seconds and images of one full epoch, each batch made training-ready on device.

    Batches are only kept, not reduced, so the loop adds no work of its own;
    the last one is summed (and the device synchronised) before the clock
    stops, which on an asynchronous device waits for every batch before it.
    """
    loader.set_epoch(epoch)
    sync(device)
    t0 = time.perf_counter()
    images, last = 0, None
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        images += len(y)
        last = x
    float(last.sum())
    sync(device)
    return time.perf_counter() - t0, images


def run(cfg, ctx):
    """The DeviceLoader over torchvision_loader, interleaved, one epoch each per repeat."""
    n, batch, repeats, device = cfg["loader_images"], cfg["loader_batch"], cfg["loader_repeats"], ctx.device
    folder = os.path.join(ctx.scratch, "loader-data", data.FOLDER)
    data.generate_synthetic(folder, n, 10, seed=0)
    (x, y), _ = data.read_cifar10(folder)
    trainer_threads = torch.get_num_threads()  # as devices.share_cores set them
    headline_threads = 1 if device.type == "cpu" else trainer_threads
    dev = loaders.DeviceLoader(x, y, batch, train=True, seed=0, device=device)
    tv = loaders.torchvision_loader(x, y, batch, train=True, seed=0, workers=2)
    head = f"device, {headline_threads} thread(s)"
    other = f"device, {trainer_threads} threads (trainer default)"
    sides = {head: (dev, headline_threads), TORCHVISION: (tv, trainer_threads)}
    if trainer_threads != headline_threads:
        sides[other] = (dev, trainer_threads)
    names = list(sides)

    def measure(name, epoch):
        loader, threads = sides[name]
        torch.set_num_threads(threads)
        try:
            seconds, images = time_loader(loader, device, epoch)
        finally:
            torch.set_num_threads(trainer_threads)
        assert images == n, (name, images, n)
        return images / seconds

    # One untimed epoch each: starts the persistent workers, warms allocators and caches.
    for name in names:
        measure(name, epoch=0)
    rates = {name: [] for name in names}
    ratios, loads = [], []
    # The headline pair alternates A B / B A; the extra side goes last, then first.
    for r, order in enumerate(harness.alternating(names, repeats)):
        for name in order:
            rates[name].append(measure(name, epoch=r + 1))
        loads.append(os.getloadavg()[0])
        ratios.append(rates[head][-1] / rates[TORCHVISION][-1])
        each = ", ".join(f"{k} {v[-1]:.0f} img/s" for k, v in rates.items())
        harness.log(f"loader repeat {r + 1}/{repeats}: {each}; ratio {ratios[-1]:.1f}")
    sides.clear()  # with dev and tv, the last references: stops the torchvision workers
    del dev, tv
    out = {
        "value": harness.median(ratios), "repeats": ratios,
        "ratio_of_medians": harness.median(rates[head]) / harness.median(rates[TORCHVISION]),
        "sides": harness.side_medians(rates, "images_per_s"),
        "load_1min": loads,
        "setup": {"images": n, "batch_size": batch, "device": str(device),
                  "headline": f"'{head}' over '{TORCHVISION}' (on the CPU one thread is the "
                              "conservative choice: the torchvision side has 2 worker processes)",
                  "headline_sides": [head, TORCHVISION],
                  "device_side": f"loaders.DeviceLoader(images_u8, labels, {batch}, train=True, "
                                 f"device={str(device)!r})",
                  "torchvision_side": f"loaders.torchvision_loader(images, labels, {batch}, train=True, "
                                      "workers=2)",
                  "timing": "one full epoch per repeat after one untimed epoch each, set_epoch(repeat); "
                            "batches moved to the device; the last batch summed and the device "
                            "synchronised before the clock stops"},
    }
    if other in rates:
        speedups = [a / b for a, b in zip(rates[other], rates[TORCHVISION])]
        out["trainer_threads_speedup"] = {"value": harness.median(speedups), "repeats": speedups,
                                          "what": f"'{other}' over '{TORCHVISION}' (not the headline)"}
    return out


def markdown(fig):
    st = fig["setup"]
    L = [f"{st['images']} synthetic CIFAR-format images, batch {st['batch_size']}, on `{st['device']}`. "
         f"Device side: `{st['device_side']}`; torchvision side: `{st['torchvision_side']}`. "
         f"Timing: {st['timing']}. Headline: {st['headline']}.", ""]
    if "trainer_threads_speedup" in fig:
        t = fig["trainer_threads_speedup"]
        L += harness.beside_line(t["what"].replace(" (not the headline)", ""), t)
    return L + harness.sides_table(fig["sides"], "images_per_s", "images/s", ".0f")
