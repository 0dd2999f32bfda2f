"""Tests for the model zoo in models/.

Everything runs on the CPU with 2 threads. The expensive part is one
forward/backward pass per model at batch 2; interface checks build models on
the "meta" device, which allocates nothing and runs no initialisers.

tests/data/kuangliu_signatures.json holds facts measured from
kuangliu/pytorch-cifar's own model code (parameter count and a hash of every
state_dict key and shape), so these tests check checkpoint compatibility with
kuangliu without shipping kuangliu's code.
"""
import ast
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import models  # noqa: E402

torch.set_num_threads(2)

MODELS_DIR = os.path.join(ROOT, "models")
with open(os.path.join(ROOT, "tests", "data", "kuangliu_signatures.json")) as f:
    SIGNATURES = json.load(f)["models"]

# kuangliu/pytorch-cifar's whole zoo, under its constructor names lower-cased.
EXPECTED_NAMES = {
    "vgg11", "vgg13", "vgg16", "vgg19",
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "preactresnet18", "preactresnet34", "preactresnet50", "preactresnet101", "preactresnet152",
    "googlenet",
    "densenet121", "densenet161", "densenet169", "densenet201", "densenet_cifar",
    "resnext29_2x64d", "resnext29_4x64d", "resnext29_8x64d", "resnext29_32x4d",
    "mobilenet", "mobilenetv2",
    "dpn26", "dpn92",
    "shufflenetg2", "shufflenetg3", "shufflenetv2",
    "senet18",
    "efficientnetb0",
    "regnetx_200mf", "regnetx_400mf", "regnety_400mf",
    "simpledla", "dla",
    "lenet",
    "pnasneta", "pnasnetb",
}
NAMES = sorted(models.MODELS)

# Parameters a forward pass never touches. kuangliu's EfficientNet builds the
# expansion conv of its first block (expand_ratio 1) but skips it; we keep it so
# kuangliu checkpoints load strictly.
UNUSED_PARAMS = {
    "efficientnetb0": {"layers.0.conv1.weight", "layers.0.bn1.weight", "layers.0.bn1.bias"},
}


def build_meta(name, num_classes=10):
    with torch.device("meta"):
        return models.get_model(name, num_classes=num_classes)


def signature(state_dict):
    """Same format as tests/data/kuangliu_signatures.json ("signature_format")."""
    lines = sorted(f"{k}:{list(v.shape)}" for k, v in state_dict.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- registry

def test_registry_covers_kuangliu_zoo_exactly():
    assert set(models.MODELS) == EXPECTED_NAMES
    assert all(callable(c) for c in models.MODELS.values())


def test_signature_file_covers_every_model():
    assert set(SIGNATURES) == set(models.MODELS)


def test_unknown_name_raises_with_valid_names():
    with pytest.raises(KeyError) as info:
        models.get_model("resnet19")
    assert isinstance(info.value, ValueError)  # catchable either way
    msg = str(info.value)
    assert "resnet19" in msg
    assert "\n" not in msg  # the trainer shows it as one line
    assert not msg.startswith(("'", '"'))  # not KeyError's quoted repr
    for name in EXPECTED_NAMES:
        assert name in msg


@pytest.mark.parametrize("bad", ["", "ResNet18", None, ["resnet18"]])
def test_non_registry_names_raise(bad):
    # Lookup is exact (the trainer validates --arch against MODELS' keys).
    with pytest.raises(KeyError, match="valid names"):
        models.get_model(bad)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_bad_num_classes_raises(bad):
    with pytest.raises(ValueError, match="num_classes"):
        models.get_model("lenet", num_classes=bad)


# ---------------------------------------------------------------- kuangliu compatibility

@pytest.mark.parametrize("name", NAMES)
def test_state_dict_and_param_count_match_kuangliu(name):
    model = build_meta(name)
    expected = SIGNATURES[name]
    sd = model.state_dict()
    assert n_params(model) == expected["params"]
    assert len(sd) == expected["state_dict_keys"]
    assert signature(sd) == expected["state_dict_sha256"]


def test_kuangliu_submodule_names():
    # Spot checks that give a readable failure if the naming drifts.
    resnet = build_meta("resnet18").state_dict()
    for key in ["conv1.weight", "bn1.running_var", "layer1.0.conv1.weight",
                "layer2.0.shortcut.0.weight", "layer2.0.shortcut.1.running_mean", "linear.weight"]:
        assert key in resnet, key
    assert "layer1.0.shortcut.0.weight" not in resnet  # identity shortcut has no weights
    vgg = build_meta("vgg11").state_dict()
    assert {"features.0.weight", "features.1.running_mean", "classifier.weight"} <= set(vgg)
    preact = build_meta("preactresnet18").state_dict()
    assert "layer2.0.shortcut.0.weight" in preact and "layer2.0.shortcut.1.weight" not in preact
    pnas = build_meta("pnasneta").state_dict()
    assert "layer2.sep_conv1.conv1.weight" in pnas  # a bare cell, not a Sequential
    dla = build_meta("dla").state_dict()
    assert "layer4.level_1.root.conv.weight" in dla and "layer4.prev_root.conv1.weight" in dla


def test_strict_load_round_trip_preserves_outputs():
    torch.manual_seed(0)
    a, b = models.get_model("shufflenetv2"), models.get_model("shufflenetv2")
    b.load_state_dict(a.state_dict(), strict=True)
    a.eval()
    b.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


# ---------------------------------------------------------------- forward / backward

@pytest.mark.parametrize("name", NAMES)
def test_forward_backward(name):
    torch.manual_seed(0)
    model = models.get_model(name)
    model.train()
    x = torch.randn(2, 3, 32, 32)
    target = torch.tensor([1, 7])
    out = model(x)
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()
    F.cross_entropy(out, target).backward()

    unused = UNUSED_PARAMS.get(name, set())
    total = 0.0
    for pname, p in model.named_parameters():
        if pname in unused:
            assert p.grad is None, f"{pname} is listed as unused but got a gradient"
            assert not p.requires_grad, f"{pname} is unused, so no port may wait for its gradient"
            continue
        assert p.requires_grad, f"{pname} is used, so it must be trained"
        assert p.grad is not None, f"{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{pname} has a non-finite gradient"
        total += p.grad.abs().sum().item()
    assert total > 0


@pytest.mark.parametrize("name", NAMES)
def test_num_classes_changes_only_the_classifier(name):
    ten = {k: tuple(v.shape) for k, v in build_meta(name, 10).state_dict().items()}
    seven = {k: tuple(v.shape) for k, v in build_meta(name, 7).state_dict().items()}
    assert ten.keys() == seven.keys()
    changed = sorted(k for k in ten if ten[k] != seven[k])
    # Exactly one classifier layer: its weight [10, d] -> [7, d] and bias [10] -> [7].
    assert len(changed) == 2, changed
    w = next(k for k in changed if k.endswith(".weight"))
    b = next(k for k in changed if k.endswith(".bias"))
    assert ten[w][0] == 10 and seven[w] == (7,) + ten[w][1:]
    assert ten[b] == (10,) and seven[b] == (7,)


@pytest.mark.parametrize("name", ["lenet", "vgg11", "resnet18", "googlenet", "shufflenetv2",
                                  "efficientnetb0", "pnasneta"])
def test_forward_with_seven_classes(name):
    # Several of these hard-code 10 outputs in kuangliu's code.
    torch.manual_seed(0)
    model = models.get_model(name, num_classes=7)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 7)
    out.sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_eval_mode_is_deterministic():
    # EfficientNet has dropout: train mode must differ between calls, eval must not.
    torch.manual_seed(0)
    model = models.get_model("efficientnetb0")
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))
        model.train()
        assert not torch.equal(model(x), model(x))


# ---------------------------------------------------------------- package hygiene

def _run_python(code):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_import_is_silent():
    r = _run_python("import models")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert r.stderr == ""


def test_import_builds_no_modules():
    code = (
        "import torch.nn as nn\n"
        "count = [0]\n"
        "orig = nn.Module.__init__\n"
        "def counting(self, *a, **k):\n"
        "    count[0] += 1\n"
        "    orig(self, *a, **k)\n"
        "nn.Module.__init__ = counting\n"
        "import models\n"
        "print(count[0], len(models.MODELS))\n"
    )
    r = _run_python(code)
    assert r.returncode == 0, r.stderr
    built, registered = map(int, r.stdout.split())
    assert built == 0
    assert registered == len(EXPECTED_NAMES)


MODEL_FILES = sorted(f for f in os.listdir(MODELS_DIR) if f.endswith(".py"))


@pytest.mark.parametrize("filename", MODEL_FILES)
def test_no_print_calls(filename):
    with open(os.path.join(MODELS_DIR, filename)) as f:
        tree = ast.parse(f.read())
    prints = [n.lineno for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]
    assert prints == [], f"print() at lines {prints}"


@pytest.mark.parametrize("filename", [f for f in MODEL_FILES if f != "__init__.py"])
def test_module_docstring_cites_paper(filename):
    with open(os.path.join(MODELS_DIR, filename)) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    assert re.search(r"\b(19|20)\d\d\b", doc), "no year"
    if filename == "lenet.py":
        assert "LeCun" in doc  # 1998, before arXiv
    else:
        assert re.search(r"arXiv:\d{4}\.\d{4,5}", doc), "no arXiv id"
