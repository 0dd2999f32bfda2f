"""Figure horovod_vs_ddp_np2: images/s of main_horovod.py under `horovodrun -np 2 --gloo`
over main_ddp.py under `torchrun --nproc_per_node 2`: the same flags, work and threads,
in the same run, alternating.

The headline trains MobileNet at batch 16, whose step takes about 0.25 s on one core, so
the figure measures training rather than launch; LeNet (a step of about 15 ms) is recorded
beside it. After the repeats, one --profile-steps run per side at np=1 (confined to half
the cores, the threads a rank gets at np=2) and at np=2 gives the medians per phase:
Horovod's allreduce wait has a phase of its own; DDP's allreduce overlaps the backward
pass and is waited for inside it, so for both the communication's cost in the step is
recorded as (backward + allreduce wait) at np=2 minus the same at np=1.
"""
import os

import torch

from benchmarks import harness, trainer_runs

NAME = "horovod_vs_ddp_np2"
GOAL = (">=", 0.95)
AGREE = 0.05  # the repeats' spread, (max - min) / median, beyond which the figure is inconclusive
DESCRIPTION = "Horovod np=2 images/s over DDP np=2 images/s, same work (MobileNet, batch 16)"
# Steady state: epoch 1 untimed, then 100 timed steps per rank at np=2 (1600 / 32 per step x 2).
MODEL = dict(arch="mobilenet", train_size=1600, train_batch=16, train_epochs=3, skip_epochs=1)
FULL = dict(trainer_runs.FULL, hvd_ddp_repeats=5, hvd_ddp_model=MODEL, hvd_ddp_profile_steps=10)
QUICK = dict(trainer_runs.QUICK, hvd_ddp_repeats=1, hvd_ddp_profile_steps=2,
             hvd_ddp_model=dict(MODEL, train_size=80, train_batch=8, train_epochs=2))
SIDE_NAMES = {"hvd2": "Horovod np=2, MobileNet", "ddp2": "DDP np=2, MobileNet",
              "hvd2_lenet": "Horovod np=2, LeNet", "ddp2_lenet": "DDP np=2, LeNet"}


def run(cfg, ctx):
    usable = sorted(os.sched_getaffinity(0))
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        return {"value": None, "skipped": "needs 2 GPUs for np=2 (one process per GPU)"}
    heavy, light = trainer_runs.shared(cfg["hvd_ddp_model"], ctx), trainer_runs.shared(cfg, ctx)
    repeats = cfg["hvd_ddp_repeats"]
    sides = {k: [] for k in SIDE_NAMES}
    ratios, lenet, example, record = [], [], {}, []
    for r, order in enumerate(harness.alternating(["hvd2", "ddp2"], repeats)):
        res = {}
        for kind in order + [k + "_lenet" for k in order]:
            res[kind] = (light if kind.endswith("_lenet") else heavy).run(kind.split("_")[0])
            assert res[kind]["world_size"] == 2
            sides[kind].append(res[kind]["images_per_s"])
            example[kind] = res[kind]["command"]
            record.append(dict(res[kind], side=kind, repeat=r + 1))
        ratios.append(res["hvd2"]["images_per_s"] / res["ddp2"]["images_per_s"])
        lenet.append(res["hvd2_lenet"]["images_per_s"] / res["ddp2_lenet"]["images_per_s"])
        harness.log(f"horovod vs ddp repeat {r + 1}/{repeats}: MobileNet {res['hvd2']['images_per_s']:.1f} / "
                    f"{res['ddp2']['images_per_s']:.1f} img/s = {ratios[-1]:.3f}; LeNet "
                    f"{res['hvd2_lenet']['images_per_s']:.0f} / {res['ddp2_lenet']['images_per_s']:.0f} = "
                    f"{lenet[-1]:.3f}")
    pin = None if torch.cuda.is_available() else set(usable[:max(1, len(usable) // 2)])
    flags = ["--profile-steps", str(cfg["hvd_ddp_profile_steps"])]
    profile = {kind: heavy.run(kind, pin=pin if kind in ("hvd", "ddp") else None, flags=flags)["profile"]
               for kind in ("hvd", "hvd2", "ddp", "ddp2")}
    waits = {}
    for name, one, two in (("horovod", "hvd", "hvd2"), ("ddp", "ddp", "ddp2")):
        def comm(kind):
            return profile[kind]["backward"] + profile[kind]["allreduce-wait"]
        waits[name] = {"allreduce_wait_ms": profile[two]["allreduce-wait"],
                       "backward_plus_wait_np2_minus_np1_ms": comm(two) - comm(one)}
    harness.log(f"allreduce per step (MobileNet): {waits}")
    return {
        "value": harness.median(ratios), "repeats": ratios,
        "ratio_of_medians": harness.median(sides["hvd2"]) / harness.median(sides["ddp2"]),
        "lenet": {"value": harness.median(lenet), "repeats": lenet},
        "allreduce_per_step": waits, "profile_ms": profile,
        "sides": harness.side_medians(sides, "images_per_s", SIDE_NAMES),
        "runs": trainer_runs.without_commands(record),
        "setup": {"model": cfg["hvd_ddp_model"], "profile_steps": cfg["hvd_ddp_profile_steps"],
                  "profile_np1_affinity": sorted(pin) if pin else None, "commands": example},
    }


def markdown(fig):
    st = fig["setup"]
    m = st["model"]
    L = [f"Headline: {m['arch']} at batch {m['train_batch']} per rank on {m['train_size']} synthetic "
         f"images, {m['train_epochs']} epochs, the first {m['skip_epochs']} untimed; beside it LeNet with "
         "the settings of scaling_efficiency_np2. Each rank runs on its own share of the cores "
         "(devices.share_cores, under either launcher).", ""]
    L += harness.command_lines(st["commands"])
    L += harness.sides_table(fig["sides"], "images_per_s", "images/s", ".1f")
    L += harness.beside_line("LeNet, Horovod over DDP", fig["lenet"])
    L += [f"Per step at np=2 ({m['arch']}, medians of the first {st['profile_steps']} steps of "
          "--profile-steps runs; np=1 confined to CPUs " + str(st["profile_np1_affinity"]) + "):", "",
          "| trainer | allreduce wait, ms | (backward + wait) np=2 minus np=1, ms |", "|---|---|---|"]
    for name, w in fig["allreduce_per_step"].items():
        L.append(f"| {name} | {w['allreduce_wait_ms']:.2f} | {w['backward_plus_wait_np2_minus_np1_ms']:.2f} |")
    L += ["", "DDP's allreduce runs inside backward (its wait has no phase of its own), hence the "
          "second column for both.", ""]
    return L
