"""The GPU-cluster table: ResNet-18 on H100s, 8 to a node with NVLink between them, at 8 to 64
GPUs with 25, 100 or 400 Gb/s between nodes, each GPU computing the H100's measured step
(results-gpu.json), split over the layers by a CPU layer profile. The scaling model predicts
every cell; each row is emulated at 32 GPUs (4 namespace hosts, each a node of 8). The figures
scaling_model_heldout_error (the table) and horovod_compiled_over_ddp_cluster_* (two of its
cells, by the Horovod port's paths) use it.
"""
import json
import os

from benchmarks import harness
from tools import emulate, layer_profile, scaling_model

NVLINK_BPS = 2400e9  # per GPU in a ring inside a node (NVLink 4 class, about 300 GB/s)
GPUS_PER_NODE = 8
NODE_RATES_GBPS = (25, 100, 400)
GPUS = (8, 16, 32, 64)
GPU_EMULATED_HOSTS = 4  # the cell each row is emulated at: 4 nodes, 32 GPUs
# (label, H100 run of results-gpu.json, batch, compiled, [(port, flags)]).
GPU_SETUPS = [("eager", "main_bs128_bf16_eager", 128, False,
               [("horovod", "default"), ("horovod", "fp16"), ("horovod", "k4"), ("ddp", "default"), ("ddp", "k4")]),
              ("--compile", "main_bs128_bf16", 128, True, [("horovod", "default"), ("horovod", "fp16"),
                                                            ("ddp", "default")]),
              ("--compile", "main_bs512_bf16", 512, True, [("horovod", "default"), ("horovod", "fp16"),
                                                            ("ddp", "default")])]


def gpu_runs():
    with open(os.path.join(harness.RESULTS, "results-gpu.json")) as f:
        return json.load(f)["runs"]


def h100_step_s(run):
    """One H100 step of `run` (results-gpu.json): its batch over its images/s."""
    r = gpu_runs()[run]
    batch = int(r["command"][r["command"].index("--batch-size") + 1]) if "--batch-size" in r["command"] else 128
    return batch / r["images_per_s"]


def gpu_profiles(cpu):
    """ResNet-18's CPU profile scaled to each H100 step of the table."""
    return {run: layer_profile.scaled(cpu["resnet18"], h100_step_s(run), f"the H100's {run} step (results-gpu.json)")
            for _, run, _, _, _ in GPU_SETUPS}


def gpu_rows(params, profs, modes):
    """Every row of the table, predicted at every GPU count."""
    rows = []
    for label, run, batch, compiled, variants in GPU_SETUPS:
        prof = profs[run]
        for gbps in NODE_RATES_GBPS:
            for port, mode in variants:
                flags = dict(modes[mode], compiled=compiled)
                row = {"setup": label, "run": run, "batch": batch, "node_gbps": gbps, "port": port, "mode": mode,
                       "compute_s": prof["step_s"], "efficiency": [], "step_s": []}
                for n in GPUS:
                    rate = NVLINK_BPS if n <= GPUS_PER_NODE else gbps * 1e9
                    point = emulate.model_point(prof, n, rate, port, flags.get("k", 1), flags.get("fp16", False),
                                                compiled)
                    row["step_s"].append(scaling_model.step_s(point, params))
                    row["efficiency"].append(scaling_model.efficiency(point, params))
                rows.append(row)
    return rows


def gpu_emulate(rows, profs, cfg, folder, modes):
    """Each row at 32 GPUs, emulated: 4 hosts, each a node of 8 GPUs."""
    n = GPU_EMULATED_HOSTS
    for gbps in NODE_RATES_GBPS:
        d, shaped = emulate.dilation(gbps * 1e9, n, GPUS_PER_NODE)
        mine = [r for r in rows if r["node_gbps"] == gbps]
        with emulate.Hosts(n, shaped, folder) as hosts:
            for port in cfg["ports"]:
                todo = [r for r in mine if r["port"] == port]
                cases = [emulate.case(f"{r['run']} {r['mode']}", profs[r["run"]], modes[r["mode"]].get("k", 1),
                                      modes[r["mode"]].get("fp16", False), r["setup"] == "--compile",
                                      cfg["steps"], cfg["warmup"]) for r in todo]
                for r, res in zip(todo, emulate.run_plan(hosts, port, cases, d, timeout=7200)):
                    k = modes[r["mode"]].get("k", 1)
                    predicted = r["step_s"][GPUS.index(n * GPUS_PER_NODE)]
                    r["emulated"] = {"gpus": n * GPUS_PER_NODE, "step_s": res["step_s"],
                                     "efficiency": k * r["compute_s"] / res["step_s"], "dilation": d,
                                     "relative_error": abs(predicted - res["step_s"]) / res["step_s"],
                                     "cpu_share": emulate.cpu_share(res)}
                    harness.log(f"GPU table, {gbps} Gb/s, {r['setup']} batch {r['batch']}, {port} {r['mode']}: "
                                f"emulated efficiency {r['emulated']['efficiency']:.2f} at {n * GPUS_PER_NODE} GPUs, "
                                f"predicted {r['efficiency'][GPUS.index(n * GPUS_PER_NODE)]:.2f}")


def flags_text(port, mode, compiled=False):
    text = {"default": "", "fp16": "--fp16-allreduce", "k4": "--batches-per-allreduce 4",
            "fusion-off": "fusion off", "compiled": "--compile",
            "hierarchical": "--compile, hierarchical allreduce"}[mode]
    return f"{port} {text}".strip() if not compiled else f"{port} --compile {text}".strip()


def gpu_markdown(rows):
    cells = [r["emulated"] for r in rows if r.get("emulated")]
    L = ["**The GPU-cluster table**: ResNet-18 on H100s, 8 to a node over NVLink, each GPU computing the H100's "
         "measured step (results-gpu.json); efficiency (1.0 = N times one GPU's images/s) by GPUs. Every cell is "
         "the fitted model's prediction; the cell in brackets beside the 32-GPU one was emulated (4 hosts, each "
         f"a node of 8). Emulated against predicted: largest error {max(c['relative_error'] for c in cells):.3f}"
         if cells else "**The GPU-cluster table** (predicted by the fitted model)", "",
         "| setup | step ms | between nodes | port and flags | " + " | ".join(str(n) for n in GPUS)
         + " | emulated at 32 |",
         "| --- | --- | --- | --- | " + " | ".join("---" for _ in GPUS) + " | --- |"]
    for r in rows:
        em = r.get("emulated")
        L.append(f"| {r['setup']}, batch {r['batch']} | {r['compute_s'] * 1e3:.2f} | {r['node_gbps']} Gb/s | "
                 f"{flags_text(r['port'], r['mode'])} | " + " | ".join(f"{e:.2f}" for e in r["efficiency"])
                 + f" | {'(' + format(em['efficiency'], '.2f') + ')' if em else 'no'} |")
    return L + [""]
