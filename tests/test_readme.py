"""README.md: the one-host commands run as written, in a tiny form, and every link resolves.

Each line of the block under "## Train on one machine" runs as pasted from the repository
root, with tiny-run flags appended (argparse's last value wins): LeNet on 200 synthetic
images for an epoch, its --checkpoint-dir moved under the test's folder. The lines run in
order, so the resume and evaluate lines read what the first one saved.
"""
import os
import re
import shlex

from helpers import ROOT, assert_ok, last_line, parse_eval, read_metrics, readme_blocks, run

HEADING = "## Train on one machine"


def tiny(line, tmp):
    """The README line as a command with tiny-run flags; `python`, `horovodrun` and `torchrun`
    are this venv's, first on the PATH that helpers.run gives, as the README asks."""
    words = shlex.split(line)
    folder = "checkpoint"
    if "--checkpoint-dir" in words:
        folder = words[words.index("--checkpoint-dir") + 1]
    epochs = "2" if "--resume" in words else "1"
    return words + ["--data-dir", str(tmp / "data"), "--dataset", "synthetic", "--synthetic-size", "200",
                    "--arch", "lenet", "--batch-size", "32", "--epochs", epochs,
                    "--checkpoint-dir", str(tmp / folder)]


def test_one_host_commands_run_as_written(tmp_path):
    lines = readme_blocks(HEADING)[0]
    launchers = [shlex.split(ln)[0] for ln in lines]
    assert {"python", "horovodrun", "mpirun", "torchrun"} <= set(launchers), lines
    assert any("--hostfile hostfile" in ln for ln in lines), "the shipped hostfile's command"
    for line in lines:
        r = assert_ok(run(tiny(line, tmp_path), timeout=300))
        if "--resume" in line:
            assert "resuming" in r.stdout
        if "--evaluate" in line:
            assert parse_eval(last_line(r.stdout))[2] == 40  # the whole synthetic test set
    for folder in {shlex.split(ln)[shlex.split(ln).index("--checkpoint-dir") + 1]
                   for ln in lines if "--checkpoint-dir" in ln}:
        assert [row["world_size"] for row in read_metrics(tmp_path / folder)] == ["2"], folder
    assert [row["epoch"] for row in read_metrics(tmp_path / "checkpoint")] == ["1", "2"]


def test_every_link_in_the_docs_resolves_inside_the_repository():
    pages = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                             if f.endswith(".md")]
    broken = []
    for page in pages:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target.split("#")[0]))
            if not path.startswith(ROOT + os.sep) or not os.path.exists(path):
                broken.append(f"{page}: {target}")
    assert not broken, broken
