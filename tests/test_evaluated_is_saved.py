"""The test figures a run logs are those of the model it saved, under every port.

Each rank updates BatchNorm's running statistics from its own batches, and evaluation is
sharded over the ranks. Unless the ranks agree on those statistics before they evaluate,
metrics.csv holds a figure measured on several slightly different models, and best.pth
is chosen by it. Here MobileNet (BatchNorm after every convolution) trains two epochs at np=2
under Horovod and DDP; then main.py --evaluate on ckpt.pth and on best.pth must give the
figures logged for their epochs. main.py sums the test set in one process, the run over two
shards, so the loss may differ in its last digits (1e-6 relative); the accuracy is a count and must be equal. Without
the agreement the loss differs by percents (see the assertion messages). main_elastic.py
evaluates through the same utils.evaluate with main_horovod.py's collectives.
"""
import pytest

from helpers import (
    assert_ok,
    common_args,
    last_line,
    load_ckpt,
    parse_eval,
    read_metrics,
    run_ddp,
    run_horovod,
    run_main,
)

# 100 images: 80 to train at batch 16 (3 steps a rank an epoch), 20 to test.
ARGS = dict(epochs=2, batch=16)
DATA = ["--synthetic-size", 100]


def train(port, data_dir, ck):
    args = [*common_args(data_dir, ck, **ARGS), *DATA, "--arch", "mobilenet", "--warmup-epochs", 0]
    if port == "horovod":
        return run_horovod(2, args)
    return run_ddp(2, args)


@pytest.mark.parametrize("port", ["horovod", "ddp"])
def test_logged_test_figures_are_the_saved_models(port, data_dir, tmp_path):
    ck = tmp_path / "ck"
    assert_ok(train(port, data_dir, ck))
    rows = read_metrics(ck)
    assert len(rows) == ARGS["epochs"]
    epochs = {name: load_ckpt(ck / name)["epoch"] for name in ("ckpt.pth", "best.pth")}
    # best.pth saved at the last epoch is the state ckpt.pth holds: evaluated once.
    for name in ["ckpt.pth"] + (["best.pth"] if epochs["best.pth"] != epochs["ckpt.pth"] else []):
        epoch = epochs[name]
        row = rows[epoch - 1]
        r = assert_ok(run_main(["--evaluate", "--checkpoint", ck / name,
                                *common_args(data_dir, ck, **ARGS)[:-2], *DATA, "--arch", "mobilenet"]))
        loss, acc, images = parse_eval(last_line(r.stdout))
        assert images == 20
        assert float(row["test_acc"]) == acc, (name, row, acc)
        assert abs(float(row["test_loss"]) - loss) <= 1e-6 * loss, (name, row["test_loss"], loss)
