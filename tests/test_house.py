"""The house's limits and the direction of its imports, read from the tracked files: six Python
files at the root, no source file over 450 lines, the README at most 250, and the layers of
training/ (base/, ports/, run/) importing only downwards, with nothing in training/ importing the
engine, an entry point or sweeps/ (docs/DESIGN.md, "The module map")."""
import ast
import os
import subprocess

from helpers import ROOT

# What each package may import of the project; the entry points and the engine may import all.
MAY_IMPORT = {
    "training.base": {"training.base"},
    "training.ports": {"training.base", "training.ports"},
    "training.run": {"training.base", "training.run", "models"},  # cli: --arch names a model
    "sweeps": {"training", "sweeps"},
}
PROJECT = ("training", "sweeps", "utils", "models", "main", "main_horovod", "main_ddp",
           "main_elastic", "main_sweep")


def tracked(*suffixes):
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.split() if f.endswith(suffixes) and os.path.isfile(os.path.join(ROOT, f))]


def lines(path):
    with open(os.path.join(ROOT, path)) as f:
        return sum(1 for _ in f)


def imports(path):
    """The project's modules `path` imports, anywhere in it (inside functions too), dotted."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in PROJECT}


def test_the_limits_hold():
    root_py = sorted(f for f in tracked(".py") if "/" not in f)
    assert len(root_py) == 6, root_py
    long = {f: lines(f) for f in tracked(".py", ".sh", ".sbatch") if lines(f) > 450}
    assert not long, f"over 450 lines: {long}"
    assert lines("README.md") <= 250


def test_imports_go_down_the_layers():
    wrong = []
    for path in tracked(".py"):
        package = ".".join(path.split("/")[:2]) if path.startswith("training/") else path.split("/")[0]
        allowed = MAY_IMPORT.get(package)
        if allowed is None or path.endswith("training/__init__.py"):
            continue
        for name in imports(path):
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                wrong.append(f"{path} imports {name}")
    assert not wrong, wrong
    # The check sees the layers: every package of training/ holds modules, and one of them
    # imports another layer.
    assert any(n.startswith("training.base") for n in imports("training/run/checkpoints.py"))
