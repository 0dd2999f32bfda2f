"""Figure scaling_efficiency_np2: images/s of horovodrun -np 2 --gloo over 2 x one process's.

The np=1 side runs with the threads each rank gets at np=2 (on the CPU: confined
to half the cores). On the CPU a third side, recorded beside the headline, runs
two independent np=1 processes at once, one on each half of the cores: the
machine's own ceiling for two processes, without Horovod.

`scaling` measures any trainer's pair of sides; ddp_scaling_efficiency_np2.py uses it for DDP.
"""
import concurrent.futures
import os

import torch

from benchmarks import harness, trainer_runs

NAME = "scaling_efficiency_np2"
GOAL = (">=", 0.90)
DESCRIPTION = "np=2 images/s over 2 x np=1 images/s, same threads per process"
FULL = dict(trainer_runs.FULL, scaling_repeats=3)
QUICK = dict(trainer_runs.QUICK, scaling_repeats=1)
SIDE_NAMES = {"np1": "np=1", "np2": "np=2",
              "pair": "two np=1 processes at once (one per half of the cores), summed"}


def run(cfg, ctx):
    return scaling(cfg, ctx, one="hvd", two="hvd2", pair=True)


def scaling(cfg, ctx, one, two, pair):
    """np=2 (trainer_runs kind `two`) over 2 x np=1 (kind `one`), alternating; with pair,
    also the machine's ceiling (two `one` processes at once) on the CPU."""
    repeats = cfg["scaling_repeats"]
    usable = sorted(os.sched_getaffinity(0))
    if torch.cuda.is_available():
        if torch.cuda.device_count() < 2:
            return {"value": None, "skipped": "needs 2 GPUs for np=2 (one process per GPU)"}
        pin = None
    else:
        if len(usable) < 2:
            return {"value": None, "skipped": "needs at least 2 CPU cores"}
        # Under horovodrun -np 2 each rank sets cores // 2 threads (devices.share_cores);
        # the np=1 baseline gets the same by being confined to half the cores, which
        # share_cores reads as a launcher binding and uses as is.
        pin = set(usable[:len(usable) // 2])
    runs = trainer_runs.shared(cfg, ctx)

    def measure(kind):
        if kind == "np1":
            return runs.run(one, pin=pin)
        if kind == "np2":
            return runs.run(two)
        half = len(pin)  # two equal halves, as np=2 gets (an odd last core stays out)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda cpus: runs.run(one, pin=cpus), [pin, set(usable[half:2 * half])]))
        return dict(both[0], images_per_s=sum(b["images_per_s"] for b in both))

    # On the CPU, the pair goes last in every repeat. No Horovod joins its two processes,
    # so their sum over 2 x np=1 is what this machine itself gives two processes (memory
    # bandwidth, caches, other tenants): the ceiling that np=2 is held to.
    pair = pair and bool(pin)
    kinds = ("np1", "np2", "pair") if pair else ("np1", "np2")
    sides = {k: [] for k in kinds}
    ratios, ceilings, example, record = [], [], {}, []
    for r, order in enumerate(harness.alternating(["np1", "np2"], repeats)):
        res = {}
        for kind in order + (["pair"] if pair else []):
            res[kind] = measure(kind)
            sides[kind].append(res[kind]["images_per_s"])
            example[kind] = res[kind]["command"]
            record.append(dict(res[kind], side=kind, repeat=r + 1))
        assert res["np2"]["world_size"] == 2 and res["np1"]["world_size"] == 1
        ratios.append(res["np2"]["images_per_s"] / (2 * res["np1"]["images_per_s"]))
        text = ""
        if pair:
            ceilings.append(res["pair"]["images_per_s"] / (2 * res["np1"]["images_per_s"]))
            text = f", two np=1 at once {res['pair']['images_per_s']:.0f} img/s (ceiling {ceilings[-1]:.3f})"
        harness.log(f"scaling repeat {r + 1}/{repeats}: np=1 {res['np1']['images_per_s']:.0f} img/s, "
                    f"np=2 {res['np2']['images_per_s']:.0f} img/s, efficiency {ratios[-1]:.3f}{text}")
    extra = {}
    if pair:
        extra["machine_ceiling"] = {
            "value": harness.median(ceilings), "repeats": ceilings,
            "what": "two independent np=1 processes started together, each one's images/s over its own "
                    "timed epochs, summed, over 2 x np=1 alone: what the machine gives two processes "
                    "without Horovod"}
        extra["of_ceiling"] = harness.median(sides["np2"]) / harness.median(sides["pair"])
    return {
        "value": harness.median(ratios), "repeats": ratios,
        "ratio_of_medians": harness.median(sides["np2"]) / (2 * harness.median(sides["np1"])), **extra,
        "sides": harness.side_medians(sides, "images_per_s", SIDE_NAMES),
        "runs": trainer_runs.without_commands(record),
        "setup": {"threads_per_process": max(1, len(usable) // 2) if pin else None,
                  "np1_affinity": sorted(pin) if pin else None,
                  "images_per_s": "sum of images over sum of epoch_time_s, metrics.csv rows after the "
                                  f"first {cfg['skip_epochs']}; at np=2 the rows count both ranks' images",
                  "commands": example},
    }


def markdown(fig):
    st = fig["setup"]
    L = [f"Threads per process: {st['threads_per_process']} (np=1 confined to CPUs {st['np1_affinity']}; "
         f"under horovodrun or torchrun each rank sets cores // local_size). Images/s: {st['images_per_s']}.", ""]
    L += harness.command_lines(st["commands"], {"pair": "twice at once, one per half of the cores"})
    L += harness.sides_table(fig["sides"], "images_per_s", "images/s", ".0f")
    if "machine_ceiling" in fig:
        c = fig["machine_ceiling"]
        L += [f"Machine ceiling ({c['what']}): median {c['value']:.3f} (repeats "
              f"{', '.join(f'{x:.3f}' for x in c['repeats'])}). np=2 reached {fig['of_ceiling']:.2f} of the "
              "two independent processes' images/s (ratio of medians).", ""]
    return L
