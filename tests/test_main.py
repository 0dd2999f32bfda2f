"""main.py end to end, as real processes on tiny synthetic data."""
import os

import pytest

from helpers import assert_one_line_error, common_args, last_line, load_ckpt, parse_eval, read_metrics, run_main

CKPT_KEYS = {"model", "optimizer", "schedule", "epoch", "best_acc", "arch", "args"}


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """Two epochs of LeNet: the run most tests below inspect."""
    ckpt = tmp_path_factory.mktemp("trained")
    r = run_main(common_args(data_dir, ckpt, epochs=2))
    assert r.returncode == 0, r.stderr
    return ckpt, r


def test_run_leaves_checkpoints_metrics_and_curves(trained):
    ckpt, r = trained
    for name in ("ckpt.pth", "best.pth", "metrics.csv", "curves.svg"):
        assert os.path.getsize(ckpt / name) > 0, name
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(ckpt / "tb"))
    rows = read_metrics(ckpt)
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert list(rows[0]) == ["epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc",
                             "epoch_time_s", "train_time_s", "images_per_s", "world_size"]
    times = [float(r["epoch_time_s"]) for r in rows]
    assert [float(r["train_time_s"]) for r in rows] == pytest.approx([times[0], times[0] + times[1]])
    assert all(r["world_size"] == "1" for r in rows)
    assert float(rows[0]["lr"]) == pytest.approx(0.05)  # cosine starts at --lr
    assert "epoch 2/2" in r.stdout


def test_checkpoint_holds_the_whole_state(trained):
    ckpt, _ = trained
    state = load_ckpt(ckpt / "ckpt.pth")
    assert CKPT_KEYS <= set(state)
    assert state["epoch"] == 2 and state["arch"] == "lenet"
    assert state["optimizer"]["state"], "momentum buffers must be saved"
    assert state["schedule"] == {"base_lr": 0.05, "start_epoch": 0}
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])
    assert 0 < state["best_acc"] <= 1
    assert state["best_acc"] == pytest.approx(max(float(r["test_acc"]) for r in read_metrics(ckpt)))


def test_synthetic_data_is_learned(data_dir, tmp_path):
    # The default-size synthetic set (5,000 images) and a small model: well above 10%.
    r = run_main(["--data-dir", data_dir, "--dataset", "synthetic", "--arch", "lenet", "--epochs", "2",
                  "--batch-size", "64", "--lr", "0.05", "--checkpoint-dir", tmp_path])
    assert r.returncode == 0, r.stderr
    assert float(read_metrics(tmp_path)[-1]["test_acc"]) > 0.30


def test_resume_continues_at_saved_epoch_with_new_lr(data_dir, tmp_path):
    assert run_main(common_args(data_dir, tmp_path, epochs=2)).returncode == 0
    r = run_main(common_args(data_dir, tmp_path, "--resume", epochs=4, lr=0.01))
    assert r.returncode == 0, r.stderr
    rows = read_metrics(tmp_path)
    assert [x["epoch"] for x in rows] == ["1", "2", "3", "4"]
    assert float(rows[2]["lr"]) == pytest.approx(0.01)  # the new cosine starts at --lr X ...
    assert float(rows[3]["lr"]) == pytest.approx(0.005)  # ... and anneals over the 2 epochs left
    assert "epoch 1/4" not in r.stdout and "epoch 3/4" in r.stdout
    state = load_ckpt(tmp_path / "ckpt.pth")
    assert state["epoch"] == 4 and state["schedule"] == {"base_lr": 0.01, "start_epoch": 2}


def test_evaluate_prints_machine_readable_line(trained):
    ckpt, _ = trained
    r = run_main(["--evaluate", "--checkpoint-dir", ckpt, *common_args_data(ckpt)])
    assert r.returncode == 0, r.stderr
    loss, acc, images = parse_eval(last_line(r.stdout))
    assert images == 100
    assert acc == pytest.approx(float(read_metrics(ckpt)[-1]["test_acc"]))
    assert loss == pytest.approx(float(read_metrics(ckpt)[-1]["test_loss"]), rel=1e-5)


def common_args_data(ckpt):
    # the data dir the module fixture used, recorded in the checkpoint's args
    args = load_ckpt(ckpt / "ckpt.pth")["args"]
    return ["--data-dir", args["data_dir"], "--dataset", "synthetic", "--synthetic-size",
            args["synthetic_size"], "--arch", "lenet"]


def test_unknown_arch_is_one_line(tmp_path):
    r = run_main(["--arch", "resnet9000", "--checkpoint-dir", tmp_path / "ck"])
    assert_one_line_error(r, "resnet9000", "--arch", code=2)
    assert not (tmp_path / "ck").exists()


def test_missing_data_is_one_line(tmp_path):
    r = run_main(["--data-dir", tmp_path / "nodata", "--arch", "lenet", "--checkpoint-dir", tmp_path / "ck"])
    assert_one_line_error(r, str(tmp_path / "nodata"), "--download", code=1)


def test_fresh_run_will_not_replace_a_checkpoint(trained, data_dir):
    ckpt, _ = trained
    before = (ckpt / "ckpt.pth").read_bytes()
    r = run_main(common_args(data_dir, ckpt))
    assert_one_line_error(r, "--resume", "--overwrite", code=2)
    assert (ckpt / "ckpt.pth").read_bytes() == before


def test_help_lists_flags_with_defaults():
    r = run_main(["--help"])
    assert r.returncode == 0
    for flag in ("--arch", "--lr", "--epochs", "--batch-size", "--data-dir", "--dataset", "--download",
                 "--checkpoint-dir", "--resume", "--evaluate", "--seed", "--workers", "--amp"):
        assert flag in r.stdout
    assert "default: resnet18" in r.stdout and "default: 200" in r.stdout and "default: 128" in r.stdout


def test_target_accuracy_ends_the_run_at_the_first_epoch_that_reaches_it(trained, data_dir, tmp_path):
    # The target is the trained run's epoch-1 accuracy: the same run (bitwise on the CPU) with
    # a longer schedule reaches it at epoch 1 at the latest, and stops there.
    ckpt, _ = trained
    first = read_metrics(ckpt)[0]
    target = float(first["test_acc"])
    r = run_main(common_args(data_dir, tmp_path, "--target-acc", target, epochs=2))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = read_metrics(tmp_path)
    assert [x["epoch"] for x in rows] == ["1"] and load_ckpt(tmp_path / "ckpt.pth")["epoch"] == 1
    seconds = float(rows[0]["train_time_s"])
    assert last_line(r.stdout) == \
        f"target test accuracy {target:g} reached at epoch 1 after {seconds:.1f} s of training"
    # A resume whose saved history already reached it trains nothing more and says so.
    import shutil
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt, resumed)
    r = run_main(common_args(data_dir, resumed, "--resume", "--target-acc", target, epochs=4))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [x["epoch"] for x in read_metrics(resumed)] == ["1", "2"]
    assert "reached at epoch 1 after" in r.stdout, r.stdout[-2000:]
