"""data.py: the CIFAR reader, the synthetic generator, and preparing under concurrency."""
import os
import pickle

import numpy as np
import pytest
import torch

from training.base.errors import TrainerError
from training.run import data


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("synth") / data.FOLDER)
    data.generate_synthetic(folder, 200, 50, seed=3)
    return folder


def test_synthetic_files_have_the_cifar_layout_and_read_back(synth):
    assert sorted(os.listdir(synth)) == sorted(data.TRAIN_FILES + [data.TEST_FILE, data.META_FILE])
    with open(os.path.join(synth, "data_batch_2"), "rb") as f:
        raw = pickle.load(f, encoding="latin1")
    assert raw["data"].dtype == np.uint8 and raw["data"].shape == (40, 3072)
    assert len(raw["labels"]) == 40
    (tx, ty), (vx, vy) = data.read_cifar10(synth)
    assert tx.shape == (200, 3, 32, 32) and tx.dtype == torch.uint8 and vx.shape == (50, 3, 32, 32)
    # Train images 40..79 are data_batch_2, in order, planes R, G, B.
    assert torch.equal(tx[40:80].reshape(40, 3072), torch.from_numpy(raw["data"]))
    assert ty[40:80].tolist() == raw["labels"]
    assert sorted(set(ty.tolist())) == list(range(10))


def test_synthetic_is_deterministic_from_the_seed(synth, tmp_path):
    again = str(tmp_path / "a")
    other = str(tmp_path / "b")
    data.generate_synthetic(again, 200, 50, seed=3)
    data.generate_synthetic(other, 200, 50, seed=4)
    (a, _), _ = data.read_cifar10(again)
    (b, _), _ = data.read_cifar10(other)
    (s, _), _ = data.read_cifar10(synth)
    assert torch.equal(a, s) and not torch.equal(b, s)


def test_real_layout_is_read_by_the_same_reader(tmp_path):
    # A Python-2-style batch file (bytes values, latin1) as the real download has.
    folder = tmp_path / data.FOLDER
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": b"x", "labels": list(range(10)),
                         "data": rng.integers(0, 256, (10, 3072), dtype=np.uint8)}, f, protocol=2)
    (tx, ty), (vx, _) = data.read_cifar10(str(folder))
    assert tx.shape == (50, 3, 32, 32) and vx.shape == (10, 3, 32, 32)


def test_reader_refuses_pickled_code(tmp_path, synth):
    folder = tmp_path / data.FOLDER
    folder.mkdir()
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        (folder / name).write_bytes(open(os.path.join(synth, name), "rb").read())
    marker = tmp_path / "ran"
    (folder / "data_batch_3").write_bytes(pickle.dumps(Boom(str(marker))))
    with pytest.raises(TrainerError, match="corrupt CIFAR batch file .*data_batch_3"):
        data.read_cifar10(str(folder))
    assert not marker.exists()


class Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_truncated_batch_is_a_clear_error(tmp_path, synth):
    folder = tmp_path / data.FOLDER
    folder.mkdir()
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        blob = open(os.path.join(synth, name), "rb").read()
        (folder / name).write_bytes(blob[:100] if name == data.TEST_FILE else blob)
    with pytest.raises(TrainerError, match="test_batch"):
        data.read_cifar10(str(folder))


# ---------------------------------------------------------------------------
# Preparing one folder from many processes at once

# A preparer: imports first, waits for the start file, then prepares synthetic data and
# downloads CIFAR-10 (torchvision's real download code, pointed at a local server).
@pytest.fixture
def cifar_server(tmp_path, synth):
    """An HTTP server on localhost serving a CIFAR-10 archive (of synthetic batches); it
    counts the archive's downloads."""
    import hashlib
    import http.server
    import tarfile
    import threading
    archive = tmp_path / "served" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(synth, arcname=data.FOLDER)
    gets = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(archive.parent), **kw)

        def do_GET(self):
            gets.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handle_error = lambda *args: None  # the redirect probe hangs up early
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{archive.name}", \
        hashlib.md5(archive.read_bytes()).hexdigest(), gets
    server.shutdown()


def test_concurrent_preparers_of_a_fresh_folder_all_succeed_once(tmp_path, synth, cifar_server):
    import json
    import subprocess

    from helpers import ROOT, env, probe_cmd
    url, md5, gets = cifar_server
    fresh, go = tmp_path / "fresh", tmp_path / "go"
    procs = [subprocess.Popen(probe_cmd("preparer", url, md5, fresh, go), cwd=ROOT, env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    assert [p.stdout.readline() for p in procs] == ["ready\n"] * 3  # all imported, all waiting
    go.touch()  # and off they go, at once
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    made = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sorted(m[0] for m in made) == [False, False, True], "synthetic data generated once"
    assert sorted(m[1] for m in made) == [False, False, True], "CIFAR-10 downloaded and extracted once"
    # One download's requests: torchvision first probes the URL for a redirect, then fetches it.
    assert 1 <= len(gets) <= 2, gets
    # Whole files: the synthetic set equals one made alone, the download equals what was served.
    alone = tmp_path / "alone"
    data.generate_synthetic(str(alone), 1000, 200, seed=0)
    ours = data.read_cifar10(data.synthetic_folder(str(fresh), 1000, 0))
    for got, want in zip(ours, data.read_cifar10(str(alone))):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for name in os.listdir(synth):
        assert open(fresh / data.FOLDER / name, "rb").read() == open(os.path.join(synth, name), "rb").read()
    leftovers = [os.path.join(d, f) for d, dirs, files in os.walk(fresh) for f in dirs + files
                 if f.endswith(".tmp") or f.startswith(".extract-")]
    assert not leftovers
