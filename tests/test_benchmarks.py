"""Tests of the benchmarks (benchmarks/): part of `make test`, or alone,
`.venv/bin/python -m pytest -q tests/test_benchmarks.py`.

The harness tests run no process. One --quick run of two cheap figures starts real trainer
processes (main.py, main_horovod.py with its hooks) and checks the whole harness: results.json,
the judging, RESULTS.md with every figure's section; about half a minute. The other figures are
checked for the harness's interface, not run: their measurements are the benchmark run's.
"""
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from benchmarks import harness, run
from benchmarks.gpu import results_section
from benchmarks.scaling import dilated

ROOT = harness.ROOT

FIGURE = types.SimpleNamespace(NAME="fake_ratio", GOAL=(">=", 1.0), DESCRIPTION="a fake figure",
                               markdown=lambda fig: [f"fake section, value {fig['value']}", ""])
OTHER = types.SimpleNamespace(NAME="fake_time", GOAL=("<=", 2.0), DESCRIPTION="another", markdown=None)


def test_alternating_reverses_every_other_repeat():
    assert harness.alternating(["a", "b"], 4) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert harness.alternating(("a", "b", "c"), 2) == [["a", "b", "c"], ["c", "b", "a"]]
    assert harness.alternating(["a", "b"], 0) == []


def test_median_and_side_medians():
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert harness.median([]) is None
    assert harness.side_medians({"a": [1.0, 3.0, 2.0]}, "train_s", {"a": "side A"}) == \
        {"side A": {"train_s": [1.0, 3.0, 2.0], "median": 2.0}}


def judged(figures, **values):
    res = {"figures": {name: dict(fig) for name, fig in values.items()}}
    return harness.judge(res, figures)["figures"]


def test_goal_judging():
    assert harness.goal_met((">=", 20.0), 20.0) and not harness.goal_met((">=", 20.0), 19.9)
    assert harness.goal_met(("<=", 1.02), 1.0) and not harness.goal_met(("<=", 1.02), 1.1)
    assert harness.goal_met((">=", 1.0), None) is None
    figs = judged([FIGURE], fake_ratio={"value": 1.5, "repeats": [1.2, 1.5, 1.8]})
    assert figs["fake_ratio"] == {"value": 1.5, "repeats": [1.2, 1.5, 1.8], "goal": ">= 1",
                                  "met": True, "repeats_agree": True}
    assert harness.verdict(figs["fake_ratio"]) == "yes"


def test_repeats_on_both_sides_of_the_goal_are_inconclusive():
    figs = judged([FIGURE, OTHER], fake_ratio={"value": 0.9, "repeats": [0.8, 0.9, 1.1]},
                  fake_time={"value": 2.5, "repeats": [2.5, 3.0]})
    assert figs["fake_ratio"]["met"] is False and figs["fake_ratio"]["repeats_agree"] is False
    assert harness.verdict(figs["fake_ratio"]) == "**no** (repeats disagree: inconclusive)"
    assert figs["fake_time"]["met"] is False and figs["fake_time"]["repeats_agree"] is True
    assert harness.verdict(figs["fake_time"]) == "**no**"


def test_a_figure_with_agree_is_inconclusive_when_its_repeats_spread_wider():
    tight = types.SimpleNamespace(NAME="tight", GOAL=(">=", 0.9), DESCRIPTION="", markdown=None, AGREE=0.05)
    figs = judged([tight], tight={"value": 1.0, "repeats": [0.98, 1.0, 1.02]})
    assert figs["tight"]["repeats_agree"] and figs["tight"]["spread"] == pytest.approx(0.04)
    figs = judged([tight], tight={"value": 1.0, "repeats": [0.95, 1.0, 1.05]})
    assert not figs["tight"]["repeats_agree"] and figs["tight"]["met"] is True
    assert harness.verdict(figs["tight"]) == "yes (repeats spread 10%: inconclusive)"


def test_figures_not_run_are_skipped_in_registry_order():
    figs = judged([FIGURE, OTHER], fake_time={"value": 1.0, "repeats": [1.0]})
    assert list(figs) == ["fake_ratio", "fake_time"]
    assert figs["fake_ratio"]["skipped"] == "not run (--only)" and figs["fake_ratio"]["met"] is None
    assert harness.verdict(figs["fake_ratio"]) == "n/a"


def test_markdown_has_summary_sections_and_factual_notes(tmp_path):
    res = {"command": "python benchmarks/run.py", "date_utc": "2000-01-01 00:00", "quick": False,
           "duration_s": 12.0, "load_average": {"start": [1.0, 1.0, 1.0], "end": [2.0, 1.5, 1.0]},
           "machine": {"cpu_model": "CPU X", "cpu_count": 2, "cpus_usable": 2, "gpu": None, "torch": "t",
                       "torchvision": "tv", "horovod": "h", "python": "3", "platform": "os", "commit": "abc",
                       "tracked_changes_outside_benchmarks": False},
           "figures": {"fake_ratio": {"value": 0.9, "repeats": [0.8, 1.1],
                                      "sides": harness.side_medians({"a": [1.0, 2.0]}, "images_per_s")}}}
    harness.judge(res, [FIGURE, OTHER])
    harness.write_markdown(tmp_path / "R.md", res, [FIGURE, OTHER])
    md = (tmp_path / "R.md").read_text()
    assert "| `fake_ratio` — a fake figure | 0.9 | >= 1 | **no** (repeats disagree: inconclusive) |" in md
    assert "## fake_ratio\n\nfake section, value 0.9\n" in md
    assert "## fake_time\n\nSkipped: not run (--only).\n" in md
    assert "- Repeats on both sides of the goal, or spread wider than the figure allows (inconclusive): " \
        "fake_ratio." in md
    assert harness.sides_table(res["figures"]["fake_ratio"]["sides"], "images_per_s", "images/s", ".0f") == \
        ["| side | images/s per repeat | median |", "|---|---|---|", "| a | 1, 2 | 2 |", ""]


def test_only_takes_figure_names_which_are_their_modules_names():
    assert run.parse_args(["--only", "loader_speedup,scaling_efficiency_np2"]).figures == \
        [run.loader_speedup, run.scaling_efficiency_np2]
    assert all(m.__name__ in (f"benchmarks.trainer.{m.NAME}", f"benchmarks.scaling.{m.NAME}") for m in run.FIGURES)
    assert run.parse_args([]).figures == run.FIGURES


# The modules of the figures' packages that are not figures: what the scaling figures share.
SHARED = {"gpu_cluster", "emulated_jobs", "dilated"}


def test_every_figure_module_has_the_harness_interface_and_is_registered():
    """What run.py and harness.py use of a figure, for all of them, without running one: the
    figures' measurements are the benchmark run's, and a quick run of two proves the harness."""
    on_disk = {f[:-3] for package in ("trainer", "scaling")
               for f in os.listdir(os.path.join(ROOT, "benchmarks", package))
               if f.endswith(".py") and f != "__init__.py"} - SHARED
    assert on_disk == {m.NAME for m in run.FIGURES}, "every figure module is listed in run.FIGURES"
    for m in run.FIGURES:
        assert m.GOAL[0] in harness.OPS and isinstance(m.GOAL[1], (int, float)), m.NAME
        assert m.DESCRIPTION and callable(m.run) and callable(m.markdown), m.NAME
        assert isinstance(m.FULL, dict) and isinstance(m.QUICK, dict) and set(m.QUICK) <= set(m.FULL), m.NAME


QUICK_FIGURES = ("loader_speedup", "horovod_hook_overhead_ms")


def test_a_quick_run_measures_judges_and_writes_its_page(tmp_path):
    """Two cheap figures through the whole harness: real trainer runs, results.json, RESULTS.md
    with every figure's section (those not run say so)."""
    r = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path),
                        "--only", ",".join(QUICK_FIGURES)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["schema"] == harness.SCHEMA and res["quick"] is True
    assert list(res["figures"]) == [m.NAME for m in run.FIGURES]
    for name, fig in res["figures"].items():
        if name not in QUICK_FIGURES:
            assert fig["skipped"] == "not run (--only)", (name, fig)
            continue
        assert isinstance(fig["value"], float), (name, fig)
        assert fig["met"] in (True, False), (name, fig)
        assert fig["goal"]
    hooks = res["figures"]["horovod_hook_overhead_ms"]
    assert set(hooks["sides"]) == {"main.py", "hooks"} and hooks["main_step_ms"] > 0
    md = (tmp_path / "RESULTS.md").read_text()
    for mod in run.FIGURES:
        assert f"`{mod.NAME}`" in md and f"## {mod.NAME}\n" in md
    for field in ("cpu_model", "torch", "horovod"):
        assert str(res["machine"][field]) in md
    assert res["command"] in md


def test_gpu_figures_refuse_without_a_gpu_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: benchmarks.gpu.trainer_figures would run")
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu.trainer_figures"], cwd=ROOT, capture_output=True,
                       text=True,
                       timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "no CUDA GPU" in r.stderr


def test_gpu_section_replaces_only_itself(tmp_path):
    gpu = {"device": "GPU Y", "duration_s": 5.0, "machine": {"torch": "t", "cpu_count": 16},
           "figures": {"main_bs128_bf16_img_s": {"value": 20000.0, "goal": ">= 35000", "met": False},
                       "bf16_over_fp32_eager": {"value": None, "goal": ">= 1", "met": None}},
           "runs": {"main_bs128_bf16": {"images_per_s": 20000.0, "command": ["python", "main.py", "--amp"], "env": {}},
                    "hvd": {"images_per_s": 9000.0, "env": {"HOROVOD_ELASTIC": "1"},
                            "command": ["/v/horovodrun", "-np", "1", "python", "main_horovod.py"]}},
           "anchors": {"airbench94": {"version": "airbench-0.1.8", "tta0_mean_acc": 0.9, "tta2_mean_acc": 0.91,
                                      "train_s": 2.0, "runs": [{}, {}]}},
           "accuracy": {"epochs": 2, "test_acc": 0.92, "train_s": 40.0, "target": 0.9, "time_to_target_s": 30.0,
                        "command": ["py", "main.py", "--recipe", "fast"],
                        "metrics": [{"epoch": "1", "test_acc": "0.5"}, {"epoch": "2", "test_acc": "0.92"}]},
           "accuracy_tta": {"test_acc": 0.93},
           "second_command": {"device": "GPU Y", "config": {"images": 100},
                              "jobs": [{"job": "ddp", "ok": False, "error": "RuntimeError: x"}]}}
    md = tmp_path / "RESULTS.md"
    md.write_text("# Benchmarks\n\ncpu figures\n")
    results_section.write(md, gpu)
    gpu["device"] = gpu["second_command"]["device"] = "GPU Z"
    results_section.write(md, gpu)  # a second run replaces the section, keeps the rest
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\ncpu figures\n\n## On a GPU: GPU Z\n") and "GPU Y" not in text
    assert "| `main_bs128_bf16_img_s` | 20000 | >= 35000 | **no** |" in text
    assert "| `bf16_over_fp32_eager` | n/a | >= 1 | not run |" in text
    assert "| main_bs128_bf16 | 20000 | `main.py --amp` |" in text
    assert "| hvd | 9000 | `HOROVOD_ELASTIC=1 horovodrun -np 1 python main_horovod.py` |" in text
    assert "| airbench94 (airbench-0.1.8), mean of 2 runs | none | 0.9000 |" in text
    assert "| its last checkpoint, `--evaluate --tta` | mirror and translate | 0.9300 |" in text
    assert "after 30 s of training" in text and "1: 0.500" in text
    assert "    ddp: FAILED, RuntimeError: x" in text


def test_merge_keeps_the_figures_not_run_marked_with_their_run(tmp_path):
    earlier = {"date_utc": "2026-01-01 00:00", "command": "python -m benchmarks.run", "machine": {"commit": "abc"},
               "figures": {"fake_ratio": {"value": 9.0, "repeats": [9.0]}, "fake_time": {"value": 1.0},
                           "gone": {"value": None, "skipped": "not run (--only)"}}}
    (tmp_path / "results.json").write_text(json.dumps(earlier))
    res = {"figures": {"fake_time": {"value": 1.5, "repeats": [1.5]}}}
    harness.merge_earlier(res, str(tmp_path / "results.json"))
    assert res["figures"]["fake_time"] == {"value": 1.5, "repeats": [1.5]}, "this run's own figure stays"
    assert res["figures"]["fake_ratio"]["value"] == 9.0 and "gone" not in res["figures"]
    assert res["figures"]["fake_ratio"]["measured_in"] == {"date_utc": "2026-01-01 00:00", "commit": "abc",
                                                           "command": "python -m benchmarks.run"}


def test_a_figure_that_raises_is_reported_and_the_others_are_written(tmp_path, monkeypatch, capsys):
    def boom(cfg, ctx):
        raise RuntimeError("no such run\nsecond line")
    def figure(name, measure):  # a module, as the registry holds
        mod = types.ModuleType(name)
        mod.__dict__.update(NAME=name, run=measure, GOAL=(">=", 1.0), DESCRIPTION="a fake figure", QUICK={},
                            FULL={}, markdown=lambda fig: [""])
        return mod
    failing = figure("fake_boom", boom)
    fine = figure("fake_fine", lambda cfg, ctx: {"value": 2.0, "repeats": [2.0]})
    monkeypatch.setattr(run, "FIGURES", [failing, fine])
    monkeypatch.setattr(run.devices, "share_cores", lambda device: None)  # this process's threads stay
    res = run.main(["--quick", "--out", str(tmp_path)])
    assert res["failed"] == ["fake_boom"] and res["figures"]["fake_fine"]["value"] == 2.0
    assert res["figures"]["fake_boom"]["skipped"] == "failed: RuntimeError: no such run"
    assert "fake_boom FAILED (RuntimeError: no such run)" in capsys.readouterr().out
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["figures"]["fake_fine"]["value"] == 2.0 and written["failed"] == ["fake_boom"]
    # With --merge the failed figure keeps what the earlier run measured.
    res = run.main(["--quick", "--out", str(tmp_path), "--merge"])
    assert res["failed"] == ["fake_boom"] and res["figures"]["fake_boom"]["skipped"].startswith("failed")
    written["figures"]["fake_boom"] = {"value": 7.0, "repeats": [7.0]}
    (tmp_path / "results.json").write_text(json.dumps(written))
    res = run.main(["--quick", "--out", str(tmp_path), "--merge"])
    assert res["figures"]["fake_boom"]["value"] == 7.0 and "measured_in" in res["figures"]["fake_boom"]


def test_render_judges_a_changed_record_again_and_rewrites_its_page(tmp_path, monkeypatch):
    """--render measures nothing: a figure's new value in results.json reaches the page and is
    judged against its goal."""
    def module(fake):  # as the registry holds them
        mod = types.ModuleType(fake.NAME)
        mod.__dict__.update(vars(fake), QUICK={}, FULL={})
        return mod
    monkeypatch.setattr(run, "FIGURES", [module(FIGURE), module(OTHER)])
    monkeypatch.setattr(run.devices, "pick_device", lambda: pytest.fail("--render picked a device"))
    res = {"schema": 1, "command": "python -m benchmarks.run", "date_utc": "2000-01-01 00:00", "quick": False,
           "duration_s": 1.0, "failed": [], "load_average": {"start": [0.0] * 3, "end": [0.0] * 3},
           "machine": {"cpu_model": "CPU X", "cpu_count": 2, "cpus_usable": 2, "gpu": None, "torch": "t",
                       "torchvision": "tv", "horovod": "h", "python": "3", "platform": "os", "commit": "abc",
                       "tracked_changes_outside_benchmarks": False},
           "figures": {"fake_ratio": {"value": 2.0, "repeats": [2.0], "goal": ">= 1", "met": True}}}
    harness.write_json(res, str(tmp_path / "results.json"))
    res["figures"]["fake_ratio"].update(value=0.5, repeats=[0.5])  # changed since it was judged
    (tmp_path / "results.json").write_text(json.dumps(res))
    assert run.parse_args(["--render"]).render
    with pytest.raises(SystemExit):
        run.parse_args(["--render", "--only", "fake_ratio"])
    out = run.main(["--render", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "results.json").read_text())
    assert out["figures"]["fake_ratio"]["met"] is False and written["figures"]["fake_ratio"]["met"] is False
    assert written["figures"]["fake_time"]["skipped"] == "not run (--only)"
    assert "fake section, value 0.5" in (tmp_path / "RESULTS.md").read_text()


def imports_of(path, package):
    """The modules of `package` that the file at path imports, read from its source (nothing is
    imported): `from a import b` counts as a.b where a.b is a module of the package, else as a."""
    import ast
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m == package or m.startswith(package + ".")}


def import_cycle(graph):
    """One cycle of the graph {module: {modules it imports}} as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = "done"
        stack.pop()
        return None
    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


def test_import_cycle_finds_a_circle_and_passes_a_tree():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_benchmark_module_imports_one_that_imports_it_back():
    """Figures import what they share from modules below them; run.py imports the figures, and
    no figure imports run.py. Read from the sources with ast, over every module of benchmarks/."""
    graph = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "benchmarks")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                graph[name] = imports_of(path, "benchmarks")
    known = set(graph)
    graph = {m: {n for n in imports if n in known and n != m} for m, imports in graph.items()}
    assert "benchmarks.run" in graph and "benchmarks.scaling.probe_vs_emulator_error" in graph["benchmarks.run"]
    assert import_cycle(graph) is None, f"an import circle: {' -> '.join(import_cycle(graph))}"
    assert not [m for m, imports in graph.items() if "benchmarks.run" in imports]


def test_a_short_step_is_timed_over_more_steps_up_to_the_most():
    from benchmarks.scaling.emulated_jobs import steps_for
    cfg = {"steps": 3, "timed_s": 3.0, "max_steps": 20}
    one_rank = {"n": 1, "compute_s": 1e-3}  # the model's step is then the compute alone
    assert steps_for(one_rank, 100, cfg) == 20  # 0.1 s of real time a step: 30 wanted, 20 at most
    assert steps_for(one_rank, 250, cfg) == 12  # 0.25 s a step
    assert steps_for(dict(one_rank, compute_s=1.0), 100, cfg) == 3  # 100 s a step: cfg's steps


def test_a_point_at_d_2d_4d_and_8d_loses_its_1_over_d_term_only_where_it_shows():
    pair = dilated.without_1_over_d
    at = lambda d, steps: {"dilation": d, "steps_s": steps, "cpu_share": 0.1 * d / 100}  # noqa: E731
    # step(D) = 5 ms + 0.4 s / D, with a little noise: 5 ms comes back, and the software cost 0.4 s.
    p = pair(at(100, [0.0089, 0.0091, 0.0090]), at(200, [0.0069, 0.0071, 0.0070]))
    assert p["one_over_d_term"] and abs(p["step_s"] - 0.005) < 1e-9 and abs(p["software_s"] - 0.4) < 1e-9
    assert p["step_s_at_d"] == pytest.approx(0.009) and p["cpu_share"] == pytest.approx(0.2)
    # Within the noise: no term, and the step is the mean of every timed step.
    q = pair(at(100, [0.0080, 0.0100, 0.0090]), at(200, [0.0085, 0.0095]))
    assert not q["one_over_d_term"] and q["step_s"] == pytest.approx(0.0090) and q["software_s"] == 0.0
    # At 4D too. Fell again: the middle of [2 step(4D) - step(2D), step(4D)], the bracket kept.
    r = pair(at(100, [0.0089, 0.0091, 0.0090]), at(200, [0.0069, 0.0071, 0.0070]), at(400, [0.0059, 0.0061, 0.006]))
    assert r["step_bracket_s"] == pytest.approx([0.005, 0.006]) and r["step_s"] == pytest.approx(0.0055)
    assert r["step_s_at_4d"] == pytest.approx(0.006) and r["software_s"] == pytest.approx(0.35)
    # A cost that stopped showing at 2D (Horovod's cycle absorbed it): the mean at 2D and 4D, not 5 ms.
    h = pair(at(100, [0.0089, 0.0091, 0.0090]), at(200, [0.0069, 0.0071, 0.0070]), at(400, [0.0071, 0.0069]))
    assert h["step_bracket_s"] is None and h["step_s"] == pytest.approx(0.0070)
    assert h["software_s"] == pytest.approx(0.2) and h["cpu_share"] == pytest.approx(0.4)
    # Falling at 4D, stopped by 8D: the mean at 4D and 8D, the bracket of 2D and 4D dropped.
    e = pair(at(100, [0.0089, 0.0091, 0.0090]), at(200, [0.0069, 0.0071, 0.0070]), at(400, [0.0059, 0.0061, 0.006]),
             at(800, [0.0061, 0.0059, 0.0060]))
    assert e["step_bracket_s"] is None and e["step_s"] == pytest.approx(0.0060)
    assert e["step_s_at_8d"] == pytest.approx(0.006) and e["cpu_share"] == pytest.approx(0.8)
    # Still falling at 8D: the middle of [2 step(8D) - step(4D), step(8D)].
    f = pair(at(100, [0.0089, 0.0091, 0.0090]), at(200, [0.0069, 0.0071, 0.0070]), at(400, [0.0059, 0.0061, 0.006]),
             at(800, [0.0054, 0.0056, 0.0055]))
    assert f["step_bracket_s"] == pytest.approx([0.005, 0.0055]) and f["step_s"] == pytest.approx(0.00525)


def test_the_trace_report_finds_the_streams_gaps_and_what_lies_over_them(tmp_path):
    # Two steps of 1 ms on the host; on the training stream (7) kernels with gaps of 200, 100 and 300 us;
    # a cudaStreamSynchronize over 150 us of the first gap and Horovod's synchronize over the whole
    # second; an NCCL kernel on another stream; two graph launches a step.
    import gzip
    import json

    from benchmarks.gpu import trace_report
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": i * 1000, "dur": 1000}
          for i in range(2)]
    ev += [{"ph": "X", "cat": "kernel", "name": "sm90_conv", "ts": a, "dur": b - a, "args": {"stream": 7}}
           for a, b in ((0, 300), (500, 900), (1000, 1300), (1600, 1900))]
    ev += [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32", "ts": 950, "dur": 100,
            "args": {"stream": 9}},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 250, "dur": 200},
           {"ph": "X", "cat": "user_annotation", "name": "hvd.synchronize", "ts": 1300, "dur": 300}]
    ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 5}
           for t in (10, 20, 1010, 1020)]
    with gzip.open(tmp_path / "run.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": ev}, f)
    r = trace_report.report(str(tmp_path))["run"]
    assert r["steps"] == 2 and r["step_ms"] == 1.0 and r["graph_launches"] == 2
    assert r["gpu_busy_ms"] == 0.65 and r["gpu_idle_ms"] == 0.3 and r["gaps_per_step"] == 1.5
    assert r["over_gaps"]["hvd.synchronize"] == 0.15 and r["over_gaps"]["cudaStreamSynchronize"] == 0.075
    assert r["nccl_ms"] == 0.05 and r["copy_ms"] == 0
    assert any("GPU busy 0.65 ms" in line for line in trace_report.lines({"run": r}))
