"""RESULTS.md's last section, "On a GPU", from benchmarks/results/results-gpu.json: the figures
that benchmarks/gpu/trainer_figures.py and scripts/gpu_check.py measured on a GPU, with their
runs and commands. benchmarks/run.py ends RESULTS.md with it; `write` replaces it alone."""
import json
import os
import re
import shlex

from benchmarks.harness import fmt
from training.base.safeio import atomic_write

GPU_HEADING = "## On a GPU"


def section(res):
    """RESULTS.md's last section: benchmarks/results/results-gpu.json (benchmarks/gpu/trainer_figures.py,
    then scripts/gpu_check.py --merge)."""
    machine = res["machine"]
    L = [f"{GPU_HEADING}: {res['device']}", "",
         "From `results-gpu.json`, which `bash benchmarks/gpu/commands.sh trainer OUT` "
         "(benchmarks/gpu/trainer_figures.py, "
         f"{res['duration_s']:.0f} s here; torch {machine['torch']}, {machine['cpu_count']} CPU cores) and then "
         "`... ports OUT` (scripts/gpu_check.py) write. Images/s are the "
         "trainer's own (metrics.csv, the last epoch; the first holds torch.compile's compiling). "
         "Absolute, on one machine: machines of the same kind have differed by up to 25%.", "",
         "| figure | value | goal | met |", "|---|---|---|---|"]
    if res.get("measured"):
        L[-3:-3] = ["", "Measured on " + "; on ".join(f"{day}: {what}" for day, what in res["measured"].items())
                    + ". Each ratio is of two runs on one machine."]
    for name, f in res["figures"].items():
        met = "not run" if f["value"] is None else "reported" if f["met"] is None else \
            ("yes" if f["met"] else "**no**")
        L.append(f"| `{name}` | {fmt(f['value'])} | {f['goal']} | {met} |")
    retired = {name: f["retired"] for name, f in res["figures"].items() if f.get("retired")}
    if retired:
        L += ["", "Reported without a goal (goals retired):", ""]
        L += [f"- `{name}`: {why}." for name, why in retired.items()]
    anchor = res.get("anchors", {}).get("airbench94")
    acc, tta = res.get("accuracy"), res.get("accuracy_tta")
    if anchor or acc:
        L += ["", "Accuracy on real CIFAR-10, a JPEG copy (quality about 75) of the original images, all "
              "runs on the same copy and GPU:", "",
              "| run | test-time augmentation | test accuracy | training time |", "|---|---|---|---|"]
    if anchor:
        n = len(anchor["runs"])
        L += [f"| airbench94 ({anchor['version']}), mean of {n} runs | none | {anchor['tta0_mean_acc']:.4f} | "
              f"{anchor['train_s']:.2f} s a run (median) |",
              f"| the same {n} networks | mirror and translate | {anchor['tta2_mean_acc']:.4f} | |"]
    if acc:
        L.append(f"| `main.py --recipe fast --amp --amp-dtype bfloat16 --compile`, {acc['epochs']} epochs | none | "
                 f"{acc['test_acc']:.4f} | {acc['train_s']:.0f} s (compiling included) |")
    if tta:
        L.append(f"| its last checkpoint, `--evaluate --tta` | mirror and translate | {tta['test_acc']:.4f} | |")
    if acc and acc.get("time_to_target_s"):
        L += ["", f"It passed airbench94's mean without test-time augmentation ({acc['target']:.4f}) after "
              f"{acc['time_to_target_s']:.0f} s of training. The accuracy run: `{shlex.join(acc['command'][1:])}`."]
    if acc and acc.get("metrics"):
        curve = ", ".join(f"{r['epoch']}: {float(r['test_acc']):.3f}" for r in acc["metrics"]
                          if int(r["epoch"]) % 5 == 0 or int(r["epoch"]) == 1)
        L += ["", f"Its test accuracy by epoch (every row is in `accuracy.metrics` of results-gpu.json): {curve}."]
    if res.get("time_to_anchor"):
        L += ["", "Time to airbench94's mean without test-time augmentation, compiling included (the fast "
              "recipe at `--target-acc`, bf16; torch.compile's on-disk caches cold, then warm from the run "
              "before):", "", "| run | time to the target | epoch 1 | epochs run | final test accuracy |",
              "|---|---|---|---|---|"]
        ta = res.get("time_to_anchor_anchor")
        if ta:
            L[-3:-3] = [f"The target is the mean of airbench94's {len(ta['runs'])} runs in the same command, "
                        f"without test-time augmentation: {ta['tta0_mean_acc']:.4f} "
                        f"({ta['tta2_mean_acc']:.4f} with it; {ta['train_s']:.2f} s a run).", ""]
        for name, t in res["time_to_anchor"].items():
            if "error" in t:
                L.append(f"| {name} | FAILED: {t['error']} | | | |")
                continue
            reached = f"{t['time_to_target_s']:.1f} s" if t["time_to_target_s"] is not None else "not reached"
            L.append(f"| {name} | {reached} | {t['first_epoch_s']:.1f} s | {t['epochs_run']} | {t['test_acc']:.4f} |")
    if res.get("levers"):
        L += ["", "Horovod's levers, np=1 with its reduction on, bf16, compiled, batch 128, each against the "
              "port's defaults on CUDA (asynchronous completion on, a 0.1 ms cycle, one allreduce a step):", "",
              "| lever | images/s | over the defaults |", "|---|---|---|"]
        L += [f"| {name} | {fmt(v['images_per_s'])} | {fmt(v['over_defaults'])} |" if v.get("images_per_s")
              else f"| {name} | not measured: {v.get('why', '')} | |" for name, v in res["levers"].items()]
    if res.get("ablation"):
        L += ["", f"The fast recipe's changes, one at a time from the recipe before them: "
              f"{res['ablation_epochs']} epochs each, the four runs side by side on the GPU, one run each:", "",
              "| recipe | test accuracy |", "|---|---|"]
        L += [f"| {name} | {fmt(r['test_acc'])} |" for name, r in res["ablation"].items()]
    L += ["", "| run | images/s | command |", "|---|---|---|"]
    for name, r in res["runs"].items():
        env = " ".join(f"{k}={v}" for k, v in r.get("env", {}).items())
        cmd = r["command"]
        cmd = cmd[1:] if "python" in os.path.basename(cmd[0]) else [os.path.basename(cmd[0]), *cmd[1:]]
        L.append(f"| {name} | {r['images_per_s']:.0f} | `{(env + ' ') if env else ''}{shlex.join(cmd)}` |")
    syncs = res.get("syncs")
    if syncs and syncs.get("epochs"):
        per = ", ".join(f"{e['syncs']} in epoch {e['epoch']} of {e['steps']} steps" for e in syncs["epochs"])
        L += ["", f"Host syncs, `{syncs['command']}`: {per} (the first epoch holds the compiling)."]
    second = res.get("second_command")
    if second:
        L += ["", f"The second command's jobs on {second['device']} (ResNet-18, {second['config']['images']:,} "
              "synthetic images, batch 128, 2 epochs, images/s of the last):", ""]
        for j in second["jobs"]:
            if j.get("images_per_s"):
                what = f"{j['images_per_s']:,.0f} img/s"
            elif j.get("lines"):
                what = "; ".join(j["lines"])
            elif "epochs" in j:
                what = ", ".join(f"{e['syncs']} syncs in an epoch of {e['steps']} steps" for e in j["epochs"])
            else:
                what = j.get("line") or j.get("error") or ""
            where = f" ({j['where']})" if j.get("where") else ""
            L.append(f"    {j['job']}: {'ok' if j['ok'] else 'FAILED'}{', ' + what if what else ''}{where}")
        L.append("")
    return scratch_named(L + [""])


def lines(folder):
    """The section from folder/results-gpu.json, [] where there is none."""
    path = os.path.join(folder, "results-gpu.json")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return section(json.load(fh))


def write(path, res):
    """Replace RESULTS.md's GPU section (or add it) without touching the CPU figures above it."""
    with open(path) as fh:
        text = fh.read()
    head = text.split("\n" + GPU_HEADING, 1)[0].rstrip("\n") + "\n\n"
    atomic_write(path, lambda f: f.write((head + "\n".join(section(res))).encode()))


# The GPU commands' temporary folders, as commands in results-gpu.json name them.
SCRATCH = re.compile(r"/tmp/(?:bench-gpu|gpu-check)-[A-Za-z0-9_]+")


def scratch_named(lines):
    """Lines with the GPU commands' temporary folders written $SCRATCH: a reader's run has its own."""
    return [SCRATCH.sub("$SCRATCH", line) for line in lines]
