"""README.md's and docs/*.md's commands against the real code, in process, in seconds.

Every shell command of the pages (```bash, ```sh and ```console blocks, and inline spans that
start with python, make or a launcher), and the examples of the trainers' --help, is read as a
user would paste it, and:
- a trainer's flags (main*.py, alone, under horovodrun, mpirun, torchrun or srun, or after a
  scripts/slurm/*.sbatch file, which adds its own) parse with that trainer's parser and checks
  (helpers.parse); `python -m tools.X` and `python -m benchmarks.X` flags parse with that
  module's parser;
- `make` targets exist, and a variable given to make reaches its recipe or scripts/setup.sh;
- the repository's files a command or a span names exist, and `-np` fits the shipped hostfile;
- README's runs write no checkpoint folder twice but to resume, evaluate or --overwrite, read
  only folders that earlier runs wrote, and fetch real CIFAR-10 (--download) when they start one;
- every figure a page links as RESULTS.md#id is in results.json, and README's lists of the
  ports' flags and of main_elastic.py's refusals, DESIGN.md's module table and the suite's
  duration (stated once, in TESTING.md) agree with the code.
A flag's value that is a placeholder ($VAR, <x>, ..., N) becomes a valid value of its type.
"""
import argparse
import ast
import contextlib
import glob
import importlib
import io
import json
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
        if w == "-m" and i + 1 < len(words) and words[i + 1].startswith(("tools.", "benchmarks.")):
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


# ---------------------------------------------------------------------------
# The tests

def test_every_command_in_the_docs_runs_with_the_real_flags_targets_and_files():
    found = [f"{c}\n    {e}" for c in all_commands() for e in errors_of(c)]
    assert not found, "\n".join(found)


def test_a_flag_that_does_not_exist_is_caught():
    cmds = commands("README.md")
    trainer = next(c for c in cmds if c.fenced and kind(c) == "trainer")
    sbatch = next(c for c in cmds if kind(c) == "sbatch")
    module = next(c for c in all_commands() if kind(c) == "module")
    for good in (trainer, sbatch, module):
        assert not errors_of(good), good
        bad = good._replace(words=good.words + ["--no-such-flag"])
        assert any("--no-such-flag" in e for e in errors_of(bad)), bad
    page = "```bash\nmake no-such-target\nmpirun -np 4 --hostfile hostfile python main.py --arch lenet\n```\n" \
           "`python main.py --epochs $E --stop-at N` and `bash scripts/no_such.sh`\n"
    errors = [e for c in commands("X.md", page) for e in errors_of(c)]
    assert ["make has no target no-such-target", "-np 4 on the shipped hostfile's 2 slots"] == errors[:2], errors
    assert len(errors) == 2, "placeholders take valid values; `bash` starts no checked command"


def readme_runs():
    """README's trainer runs in order: (command, its folder or None, its flags), less the spans
    that name a trainer without flags."""
    out = []
    for cmd in commands("README.md"):
        run = run_of(cmd)
        if run is None or run.kind == "module" or not (cmd.fenced or run.argv):
            continue
        folder = run.env.get("CHECKPOINT_DIR") if run.kind == "sbatch" else "checkpoint"
        words = run.argv
        for i, w in enumerate(words[:-1]):
            if w == "--checkpoint-dir":
                folder = words[i + 1]
        folder = folder and os.path.normpath(folder)
        if folder and program(cmd.words)[0] in ("docker", "podman"):
            folder = f"(a container's) {folder}"  # the image's trainer, in the folder mounted there
        out.append((cmd, folder, words, run))
    return out


def test_readme_runs_keep_a_checkpoint_folder_each():
    written, wrong = {}, []
    for cmd, folder, words, _ in readme_runs():
        if folder is None:
            continue
        if folder in written and not set(words) & set(STARTS_OVER):
            wrong.append(f"{cmd}\n    writes {folder} again (first: {written[folder]}); the second stops at "
                         "'ckpt.pth already exists'")
        if set(words) & {"--resume", "-r", "--evaluate"} and folder not in written:
            wrong.append(f"{cmd}\n    reads {folder}, which no earlier command wrote")
        if "--evaluate" not in words:
            written.setdefault(folder, cmd)
    assert not wrong, "\n".join(wrong)


def test_readme_runs_that_start_on_real_cifar10_download_it():
    """A user's clone has no data: every run README shows starting afresh says --download."""
    missing = [str(cmd) for cmd, _, words, run in readme_runs()
               if not set(words) & {"--resume", "-r", "--evaluate", "--download", "--data-dir"}
               and "synthetic" not in words and "DATA_DIR" not in run.env]
    assert not missing, "\n".join(missing)


def test_every_figure_linked_in_results_md_is_in_results_json():
    figures = json.loads(read("benchmarks/results/results.json"))["figures"]
    headings = {slug(h) for h in re.findall(r"^#+ (.+)$", read("benchmarks/results/RESULTS.md"), re.M) if " " in h}
    missing = [f"{page}: RESULTS.md#{anchor}" for page in PAGES
               for anchor in re.findall(r"RESULTS\.md#([\w.-]+)", read(page))
               if anchor not in figures and anchor not in headings]
    assert not missing, missing


def slug(heading):
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def listed(sentence):
    """The flags a README sentence lists, each with the values named after it."""
    return re.findall(r"`(--[\w-]+)(?: ([\w|]+))?`", sentence)


def test_readme_lists_the_flags_the_ports_add_and_what_main_elastic_refuses():
    text = " ".join(read("README.md").split())
    options = {name: {o for a in parser_of(name)._actions for o in a.option_strings} for name in TRAINERS}
    ports = re.search(r"the ports add (.*?); `main_sweep.py`", text).group(1)
    assert {f for f, _ in listed(ports)} == options["main_horovod.py"] - options["main.py"], ports
    sweep = re.search(r"`main_sweep.py` adds (.*?);", text).group(1)
    assert {f for f, _ in listed(sweep)} == options["main_sweep.py"] - options["main_horovod.py"], sweep
    said = re.search(r"`main_elastic.py` refuses (.*?)\.", text).group(1)
    refused = set()
    for action in parser_of("main_horovod.py")._actions:
        flag = action.option_strings[-1] if action.option_strings else None
        tries = [[v] for v in action.choices or ()] if action.choices else [[]] if action.nargs == 0 else [["2"]]
        for tail in tries if flag and flag != "--help" else []:
            argv = [flag, *tail, "--compile"] if tail == ["regions"] else [flag, *tail]
            if trainer_error("main_horovod.py", argv) is None and trainer_error("main_elastic.py", argv):
                refused.add((flag, tail[0] if tail else ""))
    named = {(f, v) for f, values in listed(said) for v in (values.split("|") if values else [""])}
    assert named == refused, (said, sorted(refused))


def test_design_md_names_every_module_once():
    table = read("docs/DESIGN.md").split("## The module map", 1)[1]
    named = set(re.findall(r"`([\w/]+\.py)`", table))
    modules = {p for p in subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                                         check=True).stdout.split()
               if p.startswith(("training/", "sweeps/")) and not p.endswith("__init__.py") or "/" not in p}
    assert modules - named == set(), "modules DESIGN.md's table lacks"
    assert {p for p in named if not os.path.exists(os.path.join(ROOT, p))} == set()


def test_the_suites_duration_is_stated_once_in_testing_md():
    said = [f"{page}: {line.strip()}" for page in PAGES if page != "docs/TESTING.md"
            for line in read(page).splitlines()
            if re.search(r"make test|test suite|the suite", line) and re.search(r"\d+ (to|-) ?\d+ minutes", line)]
    assert not said, said
    assert re.search(r"\d+ to \d+ minutes", read("docs/TESTING.md"))


def headings(path):
    return {slug(h) for h in re.findall(r"^#+ (.+)$", read(path), re.M)}


def test_every_section_the_docs_and_the_code_point_at_exists():
    """Links to a page's section (FILE.md#anchor, #anchor), and the code's comments that name
    one: a docs page and its anchor, or README and a quoted heading."""
    wrong = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", read(page)):
            path, anchor = target.split("#", 1)
            path = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if path.endswith(".md") and "RESULTS.md" not in path and slug(anchor) not in headings(path):
                wrong.append(f"{page}: {target}")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if f.endswith((".py", ".sh", ".sbatch", ".yaml", ".md", "Makefile", "Dockerfile")):
            text = read(f)
            for path, anchor in re.findall(r"\b(docs/[A-Z_]+\.md)#([\w-]+)", text):
                wrong += [f"{f}: {path}#{anchor}"] if slug(anchor) not in headings(path) else []
            for path, heading in re.findall(r"\b(README|[A-Z_]+\.md), \"([^\"]+)\"", text):
                path = "README.md" if path == "README" else os.path.join("docs", path)
                wrong += [f"{f}: {path}, \"{heading}\""] if slug(heading) not in headings(path) else []
    assert not wrong, wrong
