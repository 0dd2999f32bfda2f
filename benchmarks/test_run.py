"""Smoke tests of benchmarks/run.py: `.venv/bin/python -m pytest -q benchmarks`.

The --quick run starts real trainer processes (main.py, main_horovod.py,
horovodrun -np 2), so it takes about a minute on 2 cores. It checks that every
figure is produced and reported, not what the figures are.
"""
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import run  # noqa: E402


def test_sync_counter_counts_and_restores():
    before = {m: getattr(torch.Tensor, m) for m in run.SYNC_METHODS if hasattr(torch.Tensor, m)}
    tensor_before = torch.tensor
    counter = run.SyncCounter()
    with counter:
        t = torch.ones(3)
        t.sum().item()
        t.tolist()
        float(t[0])
        if t[0]:
            pass
        t.numpy()  # nested calls count once: numpy is the outermost
        torch.tensor(2.0)  # no device= : not counted
        torch.tensor(2.0, device="cpu")
        (t + 1).sum()  # no sync
    kinds = [(e[0], e[3]) for e in counter.events]
    assert kinds == [("sync", "item"), ("sync", "tolist"), ("sync", "__float__"), ("sync", "__bool__"),
                     ("sync", "numpy"), ("h2d", "torch.tensor(..., device=...)")]
    assert all("test_run.py" in e[4] for e in counter.events), counter.events
    assert {m: getattr(torch.Tensor, m) for m in before} == before
    assert torch.tensor is tensor_before
    assert "item" not in vars(torch.Tensor)


def test_quick_run_writes_every_figure(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["quick"] is True
    assert list(res["figures"]) == list(run.GOALS)
    for name, fig in res["figures"].items():
        if name == "scaling_efficiency_np2" and fig.get("skipped"):
            continue
        assert isinstance(fig["value"], float), (name, fig)
        assert fig["met"] in (True, False), (name, fig)
        assert fig["goal"]
    assert res["figures"]["host_syncs_per_step"]["syncs_at_epoch_end"] == 1
    md = (tmp_path / "RESULTS.md").read_text()
    for name in run.GOALS:
        assert f"`{name}`" in md
    for field in ("cpu_model", "torch", "horovod"):
        assert str(res["machine"][field]) in md
    assert res["command"] in md
