"""The benchmark harness: what every figure shares, and nothing of any one figure.

The machine and software, the ABBA order of a figure's sides, medians, each
figure's judgement against its goal, the results.json schema, and RESULTS.md.
A figure is a module of benchmarks/trainer/ or benchmarks/scaling/, named by its NAME, listed
once in run.py's FIGURES, with this interface:

    NAME           its key in results.json, e.g. "loader_speedup"
    GOAL           (op, target), op ">=" or "<=": what its value should meet
    DESCRIPTION    one line for the summary table
    FULL, QUICK    its own settings, for a full run and for --quick
    run(cfg, ctx)  -> {"value", "repeats", ...}, or {"value": None, "skipped": why};
                   ctx is a Context (device, scratch folder, shared set-up)
    AGREE          optional: the largest spread of the repeats, (max - min) / median, for
                   them to agree; a figure whose repeats spread wider is inconclusive
    markdown(fig)  -> the lines of its RESULTS.md section, below the heading the harness writes
    plot(fig, path)   optional: draws fig["plot"] (a file name) beside RESULTS.md
"""
import contextlib
import datetime
import json
import operator
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import torch

from training.base.safeio import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # results.json, results-gpu.json, RESULTS.md

SCHEMA = 1
OPS = {">=": operator.ge, "<=": operator.le}


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def median(xs):
    return statistics.median(xs) if xs else None


def alternating(sides, repeats):
    """The order of the sides in each repeat, reversed every other repeat (A B, B A, A B, ...),
    so that a slow drift of a shared machine falls on every side alike."""
    return [list(sides) if r % 2 == 0 else list(sides)[::-1] for r in range(repeats)]


def side_medians(values, key, names=None):
    """{side: {key: per-repeat values, "median": their median}}, sides renamed by `names`."""
    names = names or {}
    return {names.get(k, k): {key: v, "median": median(v)} for k, v in values.items()}


class Context:
    """What a figure's run() gets besides its settings: the device (as the trainer
    picks it), a scratch folder removed after the run, and set-up shared by figures."""

    def __init__(self, device, scratch):
        self.device, self.scratch, self._shared = device, scratch, {}

    def shared(self, key, make):
        """The one object for `key` in this run, made by make() on first use."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


# ============================================================================
# Goals

def goal_met(goal, value):
    op, target = goal
    return None if value is None else OPS[op](value, target)


def goal_text(goal):
    return f"{goal[0]} {goal[1]:g}"


def spread(repeats):
    """(max - min) / median of the repeats: how far apart they are, as a fraction."""
    return (max(repeats) - min(repeats)) / median(repeats) if repeats and median(repeats) else None


def judge(res, figures):
    """Each figure against its goal, and whether its repeats agree: all on the same side of
    the goal and, for a figure with AGREE, within that spread. Figures left out get a
    "skipped" entry; all of them in the registry's order."""
    figs = res["figures"]
    for mod in figures:
        f = figs.setdefault(mod.NAME, {"value": None, "skipped": "not run (--only)"})
        f["goal"] = goal_text(mod.GOAL)
        f["met"] = goal_met(mod.GOAL, f["value"])
        per_repeat = [goal_met(mod.GOAL, r) for r in f.get("repeats", [])]
        f["repeats_agree"] = bool(per_repeat) and all(m == f["met"] for m in per_repeat)
        if getattr(mod, "AGREE", None) is not None and per_repeat:
            f["spread"] = spread(f["repeats"])
            f["repeats_agree"] = f["repeats_agree"] and f["spread"] <= mod.AGREE
    res["figures"] = {mod.NAME: figs[mod.NAME] for mod in figures}
    return res


def verdict(f):
    """The summary table's "met" cell: inconclusive where the repeats do not agree (judge)."""
    text = {True: "yes", False: "**no**", None: "n/a"}[f.get("met")]
    if f.get("met") is not None and not f.get("repeats_agree"):
        text += (f" (repeats spread {100 * f['spread']:.0f}%: inconclusive)" if f.get("spread") is not None
                 else " (repeats disagree: inconclusive)")
    return text


# ============================================================================
# Machine and software

def cpu_model():
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_state():
    def git(*a):
        r = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks")
    return {"commit": head, "tracked_changes_outside_benchmarks": bool(dirty) if dirty is not None else None}


def machine_info():
    try:
        import horovod
        hvd_version = horovod.__version__
    except Exception as e:  # recorded, not fatal: the loader figure needs no Horovod
        hvd_version = f"unavailable ({type(e).__name__})"
    import torchvision
    info = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "horovod": hvd_version,
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    info.update(git_state())
    return info


# ============================================================================
# results.json

def start_results(argv, quick, config):
    """A run's results.json before its figures: the command, date, settings, machine, load."""
    python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable
    return {"schema": SCHEMA, "command": shlex.join([python, "-m", "benchmarks.run", *argv]),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "quick": quick, "config": config, "machine": machine_info(),
            "load_average": {"start": list(os.getloadavg())}, "figures": {}}


def merge_earlier(res, path):
    """Figures this run left out, taken from the earlier results.json at path, each marked
    (`measured_in`) with the run that measured it; a figure already marked keeps its mark."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        earlier = json.load(f)
    mark = {"date_utc": earlier["date_utc"], "commit": earlier["machine"]["commit"],
            "command": earlier["command"]}
    for name, fig in earlier["figures"].items():
        if name not in res["figures"] and not fig.get("skipped"):
            res["figures"][name] = dict(fig, measured_in=fig.get("measured_in", mark))


def finish(res, figures, out, started, tail=()):
    """Closes the record (load at the end, duration), judges it, writes results.json and RESULTS.md
    (`tail`: the lines that end it)."""
    res["load_average"]["end"] = list(os.getloadavg())
    res["duration_s"] = time.perf_counter() - started
    return rewrite(res, figures, out, tail)


def write_json(res, path):
    """The record as results.json at path (written whole or not at all)."""
    atomic_write(path, lambda f: f.write((json.dumps(res, indent=2) + "\n").encode()))


def rewrite(res, figures, out, tail=()):
    """Judges the record and writes results.json, RESULTS.md (`tail`: the lines that end it) and
    the figures' plots into `out`."""
    judge(res, figures)
    write_json(res, os.path.join(out, "results.json"))
    write_markdown(os.path.join(out, "RESULTS.md"), res, figures, tail)
    for mod in figures:
        fig = res["figures"][mod.NAME]
        if hasattr(mod, "plot") and fig.get("plot") and not fig.get("skipped"):
            mod.plot(fig, os.path.join(out, fig["plot"]))
    return res


# ============================================================================
# RESULTS.md

def fmt(v, digits=3):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def fmt_list(values):
    return ", ".join(fmt(v) for v in values)


def sides_table(sides, key, unit, spec):
    """The per-side table every figure has: each side's value per repeat and their median."""
    lines = [f"| side | {unit} per repeat | median |", "|---|---|---|"]
    for name, s in sides.items():
        per_repeat = ", ".join(format(x, spec) for x in s[key])
        lines.append(f"| {name} | {per_repeat} | {format(s['median'], spec)} |")
    return lines + [""]


def beside_line(what, variant):
    """A variant recorded beside the headline: {"value", "repeats"}."""
    return [f"Beside the headline, {what}: median {fmt(variant['value'])} (repeats "
            f"{fmt_list(variant['repeats'])}).", ""]


def command_lines(commands, comments=None):
    """Commands as an indented Markdown code block, an optional comment after some (by name)."""
    comments = comments or {}
    return [f"    {shlex.join(c)}" + (f"    # {comments[k]}" if k in comments else "")
            for k, c in commands.items()] + [""]


def summary(res, figures):
    m, la = res["machine"], res["load_average"]
    L = ["# Benchmarks", "",
         f"Generated by `{res['command']}` on {res['date_utc']} (UTC) in {res['duration_s']:.0f} s"
         + (" — **quick smoke run, not the real figures**" if res["quick"] else "") + ".",
         "Each figure is a ratio of two sides measured in the same run, alternating A B / B A; the value",
         "is the median of the per-repeat ratios, and every repeat is listed. Raw numbers: `results.json`.",
         "To reproduce: `.venv/bin/python -m benchmarks.run` from the repository root (about 50 minutes "
         "on 2 idle CPU cores;", "`--quick` is a smoke run that writes to a temporary folder).", "",
         "| | |", "|---|---|",
         f"| CPU | {m['cpu_model']}, {m['cpu_count']} cores ({m['cpus_usable']} usable) |",
         f"| GPU | {m['gpu'] or 'none: every figure here is CPU-only'} |",
         f"| torch / torchvision / horovod | {m['torch']} / {m['torchvision']} / {m['horovod']} |",
         f"| Python, OS | {m['python']}, {m['platform']} |",
         f"| code | commit {m['commit']}" + (", with uncommitted changes outside benchmarks/"
                                             if m["tracked_changes_outside_benchmarks"] else "") + " |",
         f"| load average (1 min) | {la['start'][0]:.2f} at start, {la['end'][0]:.2f} at end |", "",
         "| figure | value (median) | goal | met | repeats | ratio of medians |",
         "|---|---|---|---|---|---|"]
    earlier = {(m["date_utc"], m["commit"], m["command"]) for f in res["figures"].values()
               if (m := f.get("measured_in"))}
    for date, commit, command in sorted(earlier):
        names = [f"`{n}`" for n, f in res["figures"].items()
                 if f.get("measured_in", {}).get("date_utc") == date and f["measured_in"]["commit"] == commit]
        L[3:3] = [f"Kept from an earlier run (`{command}`, {date} UTC, commit {commit}): {', '.join(names)}."]
    for mod in figures:
        f = res["figures"][mod.NAME]
        value = fmt(f["value"]) if f["value"] is not None else f"skipped: {f.get('skipped')}"
        L.append(f"| `{mod.NAME}` — {mod.DESCRIPTION} | {value} | {f['goal']} | {verdict(f)} | "
                 f"{fmt_list(f.get('repeats', []))} | {fmt(f.get('ratio_of_medians'))} |")
    return L + [""]


def notes(res):
    """Facts computed from this run's numbers; no interpretation."""
    la, m = res["load_average"], res["machine"]
    out = [f"1-minute load average {la['start'][0]:.2f} at the start and {la['end'][0]:.2f} at the end, "
           f"on {m['cpus_usable']} usable cores."]
    split = [name for name, f in res["figures"].items() if f["met"] is not None and not f["repeats_agree"]]
    if split:
        out.append("Repeats on both sides of the goal, or spread wider than the figure allows "
                   "(inconclusive): " + ", ".join(split) + ".")
    return out


def write_markdown(path, res, figures, tail=()):
    """RESULTS.md: the summary, each figure's section, the notes, then the `tail` lines (the GPU
    section, which benchmarks/gpu/results_section.py writes from its own results)."""
    L = summary(res, figures)
    for mod in figures:
        f = res["figures"][mod.NAME]
        L += [f"## {mod.NAME}", ""]
        L += [f"Skipped: {f['skipped']}.", ""] if f.get("skipped") else mod.markdown(f)
    L += ["## Notes", ""] + [f"- {n}" for n in notes(res)] + [""]
    atomic_write(path, lambda f: f.write("\n".join(L + list(tail)).encode()))
