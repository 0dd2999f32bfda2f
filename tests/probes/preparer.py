"""One of several processes preparing a fresh data folder at the same moment.

    python tests/probes/preparer.py URL MD5 DATA_DIR GO_FILE

Prints "ready", waits until GO_FILE exists, then prepares synthetic data and downloads
CIFAR-10 from URL (an archive with MD5) into DATA_DIR; prints whether it did each.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torchvision  # noqa: E402

from training.run import cli, data  # noqa: E402

url, md5, data_dir, go = sys.argv[1:]
torchvision.datasets.CIFAR10.url, torchvision.datasets.CIFAR10.tgz_md5 = url, md5
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
made = [data.prepare(cli.parse_args(cli.build_parser(""), ["--dataset", kind, "--data-dir", data_dir,
                                                           "--synthetic-size", "1000", "--download"]))
        for kind in ("synthetic", "cifar10")]
print(json.dumps(made))
