"""sweeps/report.py in process: search.csv, the table and search.svg from a study's trials."""
import csv
import types
import xml.etree.ElementTree as ET

from sweeps import report

SVG = "{http://www.w3.org/2000/svg}"


def trial(number, state, value=None, lr=0.1, epochs=0, folder=None, **attrs):
    return types.SimpleNamespace(number=number, state=types.SimpleNamespace(name=state), value=value,
                                 params={"lr": lr, "arch": "lenet"}, user_attrs=dict(attrs, folder=str(folder)))


def test_the_best_completed_trials_first_every_trial_in_the_csv_and_the_figure(tmp_path, capsys):
    for n, accs in {0: [0.2, 0.4, 0.5], 1: [0.1], 3: [0.3, 0.6, 0.7]}.items():
        (tmp_path / f"trial-{n}").mkdir()
        (tmp_path / f"trial-{n}" / "metrics.csv").write_text(
            "epoch,test_acc,train_time_s\n" + "".join(f"{e},{a},{e * 1.5}\n" for e, a in enumerate(accs, 1)))
    trials = [trial(0, "COMPLETE", 0.5, lr=0.05, folder=tmp_path / "trial-0", ranks="0"),
              trial(1, "PRUNED", 0.1, lr=1e-5, folder=tmp_path / "trial-1", ranks="1"),
              trial(2, "FAIL", lr=1e38, folder=tmp_path / "trial-2", ranks="1", fail_reason="epoch 1: diverged"),
              trial(3, "COMPLETE", 0.7, lr=0.2, folder=tmp_path / "trial-3", ranks="0")]
    completed = report.write_study(str(tmp_path), ["lr", "arch"], trials, "python main_horovod.py --lr=0.2",
                                    "optuna-dashboard study.journal")
    assert completed == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"study {tmp_path}/study.journal: 4 trials, 2 complete, 1 pruned, 1 failed"
    table = out[out.index(next(ln for ln in out if ln.startswith("trial "))) + 2:][:2]
    assert [ln.split()[:3] for ln in table] == [["3", "0.7000", "0.2"], ["0", "0.5000", "0.05"]]  # best first
    assert "retrain the best trial (3) alone: python main_horovod.py --lr=0.2" in out
    with open(tmp_path / "search.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["trial"], r["state"], r["epochs"], r["reason"]) for r in rows] == \
        [("0", "complete", "3", ""), ("1", "pruned", "1", ""), ("2", "failed", "0", "epoch 1: diverged"),
         ("3", "complete", "3", "")]
    assert rows[3]["best_test_acc"] == "0.7" and rows[3]["train_time_s"] == "4.5" and rows[1]["lr"] == "1e-05"
    # The figure: trial 1, pruned, dashed and cut with an x; the best so far steps from 0.5 to 0.7.
    svg = ET.parse(tmp_path / "search.svg").getroot()
    lines = list(svg.iter(f"{SVG}polyline"))
    assert [ln.get("stroke-dasharray") is not None for ln in lines[:3]] == [False, True, False]
    best = [tuple(map(float, p.split(","))) for p in lines[-1].get("points").split()]
    assert len(best) == 7 and best[0][1] == best[2][1] > best[-1][1], best  # held, then higher (y runs down)
    assert sum(1 for p in svg.iter(f"{SVG}path") if p.get("d", "").count("M") == 2) == 2  # trial 1's cut, and pruned's


def test_a_sweep_figure_has_each_runs_curve_and_each_settings_spread(tmp_path):
    curves = {"a0": ([1, 2], [0.2, 0.4]), "a1": ([1, 2], [0.3, 0.5]), "b0": ([1], [float("nan")])}
    settings = [("lr=0.1", [0.4, 0.5], [{"run": "a0"}, {"run": "a1"}]), ("lr=1", [], [{"run": "b0"}])]
    report.plot_grid(str(tmp_path / "sweep.svg"), settings, curves)
    svg = ET.parse(tmp_path / "sweep.svg").getroot()
    assert [len(ln.get("points").split()) for ln in svg.iter(f"{SVG}polyline")] == [2, 2]  # b0: no finite point
    text = "".join(svg.itertext())
    assert "lr=0.1" in text and "lr=1" in text and "nan" not in ET.tostring(svg, encoding="unicode")
    assert sum(1 for p in svg.iter(f"{SVG}path") if "V" in p.get("d", "")) == 1  # one error bar, lr=0.1's


def test_a_study_with_no_completed_trial_says_so(tmp_path, capsys):
    assert report.write_study(str(tmp_path), ["lr"], [trial(0, "FAIL", folder=tmp_path / "none")], "", "") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no trial completed"
