"""runlog.py in process: who writes, what metrics.csv holds, what the profiler reports."""
import os
import xml.etree.ElementTree as ET

from helpers import parse
from training.run import curves, runlog
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
    assert ET.parse(tmp_path / "curves.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    assert sorted(os.listdir(tmp_path)) == ["curves.svg", "metrics.csv", "tb"], "no checkpoint: runlog only reports"


def test_curves_draw_each_column_a_point_an_epoch_and_leave_out_what_is_not_finite():
    history = [_row(e, acc, train_loss=loss, train_time_s=2.0 * e)
               for e, acc, loss in ((1, 0.3, 2.0), (2, 0.6, float("inf")), (3, 0.5, 1.0))]
    root = ET.fromstring(curves.svg(history))
    lines = {p.get("data-key") + ("@time" if i == 4 else ""): [tuple(map(float, xy.split(",")))
                                                             for xy in p.get("points").split()]
             for i, p in enumerate(root.iter("{http://www.w3.org/2000/svg}polyline"))}
    assert sorted(lines) == sorted(["train_loss", "test_loss", "train_acc", "test_acc", "test_acc@time", "lr",
                                    "images_per_s"]), lines
    assert len(lines["train_loss"]) == 2 and "inf" not in curves.svg(history).lower()
    acc = lines["test_acc"]
    assert len(acc) == 3 and acc[0][0] < acc[1][0] < acc[2][0], "epochs run left to right"
    assert acc[1][1] < acc[2][1] < acc[0][1], "the best accuracy is the highest point (SVG's y runs down)"
    assert len(lines["test_acc@time"]) == 3
    empty = ET.fromstring(curves.svg([_row(1, float("nan"))]))  # one epoch, a value that is not finite
    assert "no finite values" in "".join(empty.itertext())


def test_a_replaced_world_closes_without_curves(tmp_path):
    log = runlog.RunLog(_args(tmp_path), True, 1, [])
    log.add(0, *ROW, 2.0)
    log.close(final=False)
    assert not (tmp_path / "curves.svg").exists()


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


def hparams_sessions(folder):
    """[(settings, {metric: value})] of the HPARAMS sessions in TensorBoard's event files under
    `folder`, read with TensorBoard's own reader and protos."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2
    sessions, scalars = [], {}
    for name in sorted(os.listdir(folder)):
        for event in EventFileLoader(os.path.join(folder, name)).Load():
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
                    if data.HasField("session_start_info"):
                        hp = data.session_start_info.hparams
                        sessions.append({k: hp[k].WhichOneof("kind") and getattr(hp[k], hp[k].WhichOneof("kind"))
                                         for k in hp})
                elif v.tag.startswith("hparam/"):
                    scalars[v.tag] = v.tensor.float_val[0] if v.HasField("tensor") else v.simple_value
    return [(s, scalars) for s in sessions]


def test_hparams_hold_the_flags_and_the_final_figures_once_per_run(tmp_path):
    args = parse("--checkpoint-dir", tmp_path, "--epochs", 3, "--lr", "0.05")
    log = runlog.RunLog(args, True, 2, [])
    log.add(0, *ROW, 2.0)
    log.write()
    log.close()
    resumed = runlog.RunLog(args, True, 2, log.history, first_epoch=1)  # the same run, continued
    resumed.add(1, ROW[0], {"loss": 1.0, "acc": 0.75, "images": 20}, 2.0)
    resumed.write()
    resumed.close()
    [(settings, figures)] = hparams_sessions(tmp_path / "tb" / "hparams")  # one session: the last
    assert settings["lr"] == 0.05 and settings["world_size"] == 2 and settings["arch"] == args.arch
    assert settings["target_acc"] == "None"  # what is not a number, text or bool, as text
    assert figures == {"hparam/final_test_acc": 0.75, "hparam/best_test_acc": 0.75, "hparam/epochs": 2,
                       "hparam/train_time_s": 4.0}
