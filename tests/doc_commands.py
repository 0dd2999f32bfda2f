"""The commands of README.md, docs/*.md and the trainers' --help, read as a user would paste them,
and what is wrong with each against the real code (errors_of): the trainer's or the module's own
parser, the Makefile, the repository's files and the shipped hostfile. tests/test_docs.py uses it.
A flag's value that is a placeholder ($VAR, <x>, ..., N) becomes a valid value of its type.
"""
import argparse
import ast
import contextlib
import glob
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
import typing
from unittest import mock

import torch

from helpers import ROOT, parse
from sweeps import flags
from training.base.errors import UsageError
from training.run import cli

PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
TRAINERS = {"main.py": None, "main_horovod.py": "horovod", "main_ddp.py": "ddp", "main_elastic.py": "elastic",
            "main_sweep.py": "sweep"}
STARTS = ("python", "python3", "make", "horovodrun", "mpirun", "torchrun", "srun", "sbatch")
PLACEHOLDER = re.compile(r"\$.*|<.*>|\.\.\.|[A-Z][A-Z_]*")
STARTS_OVER = ("--resume", "-r", "--auto-resume", "--evaluate", "--overwrite")


class Command(typing.NamedTuple):
    page: str
    line: int
    words: list
    fenced: bool

    def __str__(self):
        return f"{self.page}:{self.line}: {shlex.join(self.words)}"


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def tracked_tops():
    """The repository's top-level names, less the folders runs write into."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {f.split("/")[0] for f in files} - {"checkpoint", ".ci", ".gitignore", ".dockerignore"}


TOPS = tracked_tops()


def words_of(text):
    """A command line as the shell splits it, comments dropped; None where it does not split."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def command_lines(body, console):
    """(offset, text) of each command of a block, continuation lines joined."""
    out, pending, start = [], "", 0
    for n, line in enumerate(body.split("\n")):
        if console and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        start = n if not pending else start
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def commands(page, text=None):
    """Every command of a page: its fenced blocks' lines, then its inline spans that start a
    command."""
    text = read(page) if text is None else text
    found = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) in ("bash", "sh", "console"):
            first = text.count("\n", 0, m.start(2)) + 1
            for offset, line in command_lines(m.group(2), m.group(1) == "console"):
                words = words_of(line)
                if words:
                    found.append(Command(page, first + offset, words, True))
    prose = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    for m in re.finditer(r"`([^`]+)`", prose):
        words = words_of(" ".join(m.group(1).split()))
        if words and len(words) > 1 and program(words)[0] in STARTS:
            found.append(Command(page, prose.count("\n", 0, m.start()) + 1, words, False))
    return sorted(found, key=lambda c: c.line)


def help_commands():
    """The example commands of each trainer's --help: indented lines that start a command."""
    found = []
    for name in TRAINERS:
        text = parser_of(name).format_help()
        for offset, line in command_lines(text, console=False):
            words = words_of(line)
            if line.startswith(" ") and words and program(words)[0] in STARTS:
                found.append(Command(f"{name} --help", offset + 1, words, True))
    return found


def program(words):
    """(the program's name, its environment assignments, its words from the program on)."""
    env, i = {}, 0
    while i < len(words) and re.match(r"[A-Za-z_]\w*=", words[i]):
        name, _, value = words[i].partition("=")
        env[name], i = value, i + 1
    while i < len(words) and words[i] in ("sudo", "-E"):
        i += 1
    rest = words[i:]
    return (os.path.basename(rest[0]) if rest else ""), env, rest


class Run(typing.NamedTuple):
    """What a command runs: a trainer or a module with the flags it gets, and how."""
    kind: str  # "trainer", "module" or "sbatch"
    name: str  # main.py, tools.predict, or the .sbatch file
    trainer: str  # the trainer a trainer or sbatch run starts
    argv: list  # the command's own flags, as written
    env: dict


def run_of(cmd):
    _, env, words = program(cmd.words)
    for i, w in enumerate(words):
        base = os.path.basename(w)
        if base in TRAINERS:
            return Run("trainer", base, base, words[i + 1:], env)
        if w == "-m" and i + 1 < len(words) and words[i + 1].startswith(("tools.", "benchmarks.", "scripts.")):
            return Run("module", words[i + 1], None, words[i + 2:], env)
        if w.endswith(".sbatch"):
            return Run("sbatch", w, env.get("TRAINER") or sbatch_default(w), words[i + 1:], env)
    return None


def kind(cmd):
    run = run_of(cmd)
    return run.kind if run else None


def sbatch_default(script):
    if not os.path.isfile(os.path.join(ROOT, script)):
        return "main_horovod.py"
    found = re.search(r"TRAINER=\$\{TRAINER:-(\S+?)\}", read(script))
    return found.group(1) if found else "main_horovod.py"


def sbatch_flags(script):
    """The flags an sbatch file gives its trainer before the user's ("$@")."""
    text = read(script).replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if '"$TRAINER"' in ln and '"$@"' in ln)
    return shlex.split(line.split('"$TRAINER"', 1)[1].split('"$@"', 1)[0])


# ---------------------------------------------------------------------------
# Parsers

def parser_of(trainer):
    """A trainer's parser, built as the trainer builds it (each trainer's source names its port)."""
    port = TRAINERS[trainer]
    source = read(trainer)
    if port == "sweep":
        assert "flags.parse_args(" in source
        return flags.add_args(cli.build_parser(ast.get_docstring(ast.parse(source), clean=False)))
    assert "cli.build_parser(__doc__)" in source and (port is None or f"add_{port}_args" in source), trainer
    p = cli.build_parser(ast.get_docstring(ast.parse(source), clean=False))
    return getattr(cli, f"add_{port}_args")(p) if port else p


class Captured(BaseException):
    def __init__(self, parser):
        self.parser = parser


_MODULE_PARSERS = {}


def module_parser(name):
    """The parser a module's main() builds, taken as it parses (nothing after that runs)."""
    if name not in _MODULE_PARSERS:
        module = importlib.import_module(name)

        def capture(self, *a, **k):
            raise Captured(self)
        with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), \
                mock.patch.object(sys, "argv", [name]):
            try:
                module.main([]) if "argv" in module.main.__code__.co_varnames else module.main()
            except Captured as c:
                _MODULE_PARSERS[name] = c.parser
    return _MODULE_PARSERS[name]


def with_dummies(parser, argv):
    """argv with each placeholder value replaced by a valid one for its flag, and a trailing
    "..." (more flags) dropped."""
    out, argv = [], list(argv)
    while argv:
        word = argv.pop(0)
        action = parser._option_string_actions.get(word.split("=")[0])
        out.append(word)
        if action is None or "=" in word or action.nargs == 0 or not argv:
            continue
        if action.nargs == "?" and argv[0].startswith("-"):
            continue
        value = argv.pop(0)
        if PLACEHOLDER.fullmatch(value) and value not in (action.choices or ()):
            value = dummy(action)
        out.append(value)
    return [w for w in out if w != "..."]


def dummy(action):
    if action.choices:
        return str(next(iter(action.choices)))
    if action.type is int:
        return "1"
    if action.type is float:
        return "0.5"
    return str(action.default) if isinstance(action.default, str) else "x"


def trainer_error(trainer, argv):
    """The trainer's own refusal of argv (one line), or None. GPU-only settings pass, as on a
    GPU machine."""
    argv = with_dummies(parser_of(trainer), argv)
    try:
        with mock.patch.object(torch.cuda, "is_available", return_value=True):
            parse(*argv, port=TRAINERS[trainer])
    except UsageError as e:
        return f"{trainer} refuses {shlex.join(argv)}: {e}"
    return None


def module_error(name, argv):
    parser = module_parser(name)
    argv = with_dummies(parser, argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.ExitStack() as stack:
            for action in parser._actions:  # a span may name the module alone: flags are checked
                stack.enter_context(mock.patch.object(action, "required", False))
            parser.parse_args(argv)
    except (SystemExit, Exception) as e:
        return f"python -m {name} refuses {shlex.join(argv)}: {(err.getvalue().strip() or str(e)).splitlines()[-1]}"
    return None


# ---------------------------------------------------------------------------
# The checks of one command

def make_targets():
    return dict(re.findall(r"^([\w-]+):[^=]*?\n((?:\t.*\n)*)", read("Makefile"), re.M))


def make_errors(words):
    targets, errors = make_targets(), []
    given = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    for word in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
        errors += [f"make has no target {t}" for t in word.split("/") if t not in targets]
    for var, value in given.items():
        users = [t for t, recipe in targets.items() if f"$({var})" in recipe]
        named = re.search(rf"\$\(?{var}\b|\$\{{{var}\b|^{var} \?=", read("Makefile") + read("scripts/setup.sh"), re.M)
        if not users and not named:
            errors.append(f"{var}= reaches no recipe of the Makefile and not scripts/setup.sh")
        for target in (t for t in users if t in words):
            line = next(ln.split() for ln in targets[target].splitlines() if f"$({var})" in ln)
            at = line.index(f"$({var})") if f"$({var})" in line else 0
            if "-m" in line[:at] and not line[at - 1].startswith("-"):  # flags of their own, not a value
                errors += filter(None, [module_error(line[line.index("-m") + 1], shlex.split(value))])
    return errors


def path_errors(words):
    """The repository's files and folders a command names, that are missing."""
    missing = []
    for word in words:
        for part in word.split():
            part = part.split("=", 1)[-1] if part.startswith("-") else part
            part = re.sub(r"^(\$PWD/|\./|/opt/cifar/)", "", part)
            if re.search(r"[<*${]", part) or not part:
                continue
            if part.split("/")[0] in TOPS and ("/" in part or part in ("hostfile",)):
                if not os.path.exists(os.path.join(ROOT, part)):
                    missing.append(f"{part} is not in the repository")
    return missing


def hostfile_errors(words):
    if "hostfile" not in words[1:] or words[words.index("hostfile") - 1] != "--hostfile" or "--oversubscribe" in words:
        return []
    slots = sum(int(n) for n in re.findall(r"^[^#\n]*slots=(\d+)", read("hostfile"), re.M))
    nps = [int(words[i + 1]) for i, w in enumerate(words[:-1]) if w in ("-np", "-n") and words[i + 1].isdigit()]
    return [f"-np {n} on the shipped hostfile's {slots} slots" for n in nps if n > slots]


def errors_of(cmd):
    name, _, words = program(cmd.words)
    errors = path_errors(cmd.words) + hostfile_errors(words)
    if name == "make":
        return errors + make_errors(words)
    run = run_of(cmd)
    if run is None:
        return errors
    if run.kind == "module":
        return errors + list(filter(None, [module_error(run.name, run.argv)]))
    argv = run.argv if run.kind == "trainer" else sbatch_flags(run.name) + run.argv
    return errors + list(filter(None, [trainer_error(run.trainer, argv)]))


def all_commands():
    return [c for page in PAGES for c in commands(page)] + help_commands()
