"""README.md's and docs/*.md's commands against the real code, in process, in seconds.

Every shell command of the pages (```bash, ```sh and ```console blocks, and inline spans that
start with python, make or a launcher), and the examples of the trainers' --help, is read as a
user would paste it, and:
- a trainer's flags (main*.py, alone, under horovodrun, mpirun, torchrun or srun, or after a
  scripts/slurm/*.sbatch file, which adds its own) parse with that trainer's parser and checks
  (helpers.parse); `python -m tools.X`, `python -m benchmarks.X` and `python -m scripts.X` flags
  parse with that module's parser;
- `make` targets exist, and a variable given to make reaches its recipe or scripts/setup.sh;
- the repository's files a command or a span names exist, and `-np` fits the shipped hostfile;
- README's runs write no checkpoint folder twice but to resume, evaluate or --overwrite, read
  only folders that earlier runs wrote, and fetch real CIFAR-10 (--download) when they start one;
- every figure a page links as RESULTS.md#id is in results.json, and README's lists of the
  ports' flags and of main_elastic.py's refusals, DESIGN.md's module table and the suite's
  duration (stated once, in TESTING.md) agree with the code.
A flag's value that is a placeholder ($VAR, <x>, ..., N) becomes a valid value of its type.
"""

import json
import os
import re
import subprocess

from doc_commands import (
    PAGES,
    STARTS_OVER,
    TRAINERS,
    all_commands,
    commands,
    errors_of,
    kind,
    parser_of,
    program,
    read,
    run_of,
    trainer_error,
)
from helpers import ROOT


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
