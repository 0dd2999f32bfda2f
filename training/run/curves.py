"""curves.svg: a run's history as five small charts (training/base/svgchart.py): loss and
accuracy (train and test), the learning rate and training images/s by epoch, and test accuracy
against training time. A search trial's every epoch ends a run, so this is drawn often: as SVG
text it costs milliseconds.
"""
from training.base import svgchart

CHARTS = (("loss", "epoch", (("train", "train_loss"), ("test", "test_loss"))),
          ("accuracy", "epoch", (("train", "train_acc"), ("test", "test_acc"))),
          ("test accuracy against training time", "train_time_s", (("test", "test_acc"),)),
          ("learning rate", "epoch", (("", "lr"),)),
          ("training images/s", "epoch", (("", "images_per_s"),)))
AXIS_NAMES = {"epoch": "epoch", "train_time_s": "training time (s)"}


def svg(history):
    """The whole of curves.svg for the rows of metrics.csv (dicts of METRICS_COLUMNS); a value
    a row lacks, or one that is not finite, is left out of its line."""
    charts = []
    for title, x_key, columns in CHARTS:
        series = [{"points": [(r.get(x_key), r.get(key)) for r in history], "key": key,
                   "label": label if len(columns) > 1 else None, "color": svgchart.PALETTE[i],
                   "marker": "dot"} for i, (label, key) in enumerate(columns)]
        charts.append((title, AXIS_NAMES[x_key], series, None))
    return svgchart.page(charts)
