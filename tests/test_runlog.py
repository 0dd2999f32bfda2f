"""runlog.py in process: who writes, what metrics.csv holds, what the profiler reports."""
import os

from helpers import parse
from training.run import runlog
import utils


def _args(folder):
    return parse("--checkpoint-dir", folder, "--epochs", 3)


ROW = ({"loss": 1.5, "acc": 0.4, "images": 100, "lr": 0.1}, {"loss": 1.2, "acc": 0.5, "images": 20})


def test_only_the_process_that_reports_writes(tmp_path):
    quiet = runlog.RunLog(_args(tmp_path / "quiet"), False, 2, [])
    quiet.add(0, *ROW, 2.0)
    quiet.write()
    quiet.close()
    assert not (tmp_path / "quiet").exists()
    assert quiet.history[0]["epoch"] == 1  # it keeps the history all the same


def test_metrics_are_rewritten_from_the_whole_history(tmp_path, capsys):
    log = runlog.RunLog(_args(tmp_path), True, 2, [{"epoch": 1, "lr": 0.2, "train_loss": 2.0,
                                                    "train_acc": 0.1, "test_loss": 2.0, "test_acc": 0.1,
                                                    "epoch_time_s": 1.0, "images_per_s": 50.0,
                                                    "world_size": 2}], first_epoch=1)
    history = log.add(1, *ROW, 2.0)
    assert [r["epoch"] for r in history] == [1, 2] and "epoch 2/3" in capsys.readouterr().out
    assert not (tmp_path / "metrics.csv").exists(), "add() prints; write() writes"
    log.write()
    log.close()
    rows = open(tmp_path / "metrics.csv").read().splitlines()
    assert rows[0] == ",".join(runlog.METRICS_COLUMNS) and [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    assert os.path.getsize(tmp_path / "curves.png") > 0
    assert sorted(os.listdir(tmp_path)) == ["curves.png", "metrics.csv", "tb"], "no checkpoint: runlog only reports"


def test_a_replaced_world_closes_without_curves(tmp_path):
    log = runlog.RunLog(_args(tmp_path), True, 1, [])
    log.add(0, *ROW, 2.0)
    log.close(final=False)
    assert not (tmp_path / "curves.png").exists()


def _row(epoch, acc, seconds=2.0, **more):
    return dict({"epoch": epoch, "lr": 0.1, "train_loss": 1.0, "train_acc": 0.5, "test_loss": 1.0,
                 "test_acc": acc, "epoch_time_s": seconds, "images_per_s": 10.0, "world_size": 1}, **more)


def test_training_time_accumulates_across_a_resume(tmp_path):
    # Rows of a checkpoint written before train_time_s existed get it from their epoch times.
    log = runlog.RunLog(_args(tmp_path), False, 1, [_row(1, 0.3, 2.0), _row(2, 0.4, 3.0)], first_epoch=2)
    assert [r["train_time_s"] for r in log.history] == [2.0, 5.0]
    history = log.add(2, *ROW, 4.0)
    assert history[-1]["train_time_s"] == 9.0 and history[-1]["epoch_time_s"] == 4.0


def test_target_accuracy_line_and_stop():
    history = runlog.with_train_time([_row(1, 0.3), _row(2, 0.52), _row(3, 0.51)])
    assert runlog.first_reaching(history, 0.5)["epoch"] == 2 and runlog.first_reaching(history, None) is None
    assert runlog.target_line(history, 0.5) == "target test accuracy 0.5 reached at epoch 2 after 4.0 s of training"
    assert runlog.target_line(history, 0.6) == \
        "target test accuracy 0.6 not reached by epoch 3 (best 0.5200 at epoch 2; 6.0 s of training)"
    args = parse("--target-acc", 0.5)
    assert utils.target_reached(args, history[:2]) and not utils.target_reached(args, history[:1])
    assert not utils.target_reached(parse(), history)
