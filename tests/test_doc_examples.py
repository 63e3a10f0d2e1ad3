"""Every code example in the documentation runs, or is checked against the command it names.

The documents are README.md, docs/*.md and tests/README.md. Their fenced blocks:
- ```python: executed, each in its own process, as a world of one (comm.init() without a launcher);
- ```bash / ```sh / ```console: every command line of this project (python -m mxnet_pfc.X, mxnet-pfc-*,
  make TARGET, bash config.sh / run.sh, under horovodrun or not) is parsed by the command's real parser, so
  it names only options that exist, with values they accept; the cheap ones (--help, the planner) run;
- ```text: what the reader is shown (output, formulas, layouts), not run; so is a code block preceded by
  <!-- not-run: REASON -->. Both are counted, so that escape hatch stays small.
Indented code blocks are refused (they would escape all of this). Every relative link, its #anchor, and
every path of this repository a document names must exist.
"""
import argparse
import contextlib
import io
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import import_module
from pathlib import Path
from unittest import mock

import pytest

from launch import REPO, run_command

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "tests" / "README.md"]
RUN_LANGS = {"python"}
COMMAND_LANGS = {"bash", "sh", "console"}
SHOWN_LANGS = {"text"}
MAX_NOT_RUN = 2          # code blocks marked <!-- not-run: ... -->
MAX_TEXT = 27            # ```text blocks: output, formulas, layouts (DESIGN's 20, a timeline, Slurm's 2, the doctor's)
# Commands of others a shell block may use; their own options are theirs to check.
OTHER_COMMANDS = {"horovodrun", "mpirun", "sha256sum", "salloc", "scancel", "squeue", "sbatch"}
CHEAP_MODULES = {"mxnet_pfc.plan"}     # run as written, not only parsed
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->")


@dataclass
class Block:
    doc: Path
    line: int                # of the opening fence, 1-based
    lang: str
    text: str
    not_run: "str | None"    # the reason given in <!-- not-run: REASON --> just before it

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def fenced_blocks(doc: Path) -> "list[Block]":
    blocks, lines, i = [], doc.read_text().split("\n"), 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start, lang = i, lines[i][3:].strip()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            assert end is not None, f"{doc.relative_to(REPO)}:{i + 1}: a fence that is never closed"
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            found = NOT_RUN.fullmatch(before.strip())
            blocks.append(Block(doc, start + 1, lang, "\n".join(lines[start + 1:end]), found and found[1]))
            i = end
        i += 1
    return blocks


ALL_BLOCKS = [block for doc in DOCUMENTS for block in fenced_blocks(doc)]


def blocks_to(action: str) -> "list[Block]":
    """The blocks to execute ('run') or to check as command lines ('check')."""
    langs = RUN_LANGS if action == "run" else COMMAND_LANGS
    return [b for b in ALL_BLOCKS if b.lang in langs and b.not_run is None]


def test_every_block_says_what_it_is_and_the_unchecked_ones_stay_few():
    unknown = [f"{b.where}: ```{b.lang}" for b in ALL_BLOCKS if b.lang not in RUN_LANGS | COMMAND_LANGS | SHOWN_LANGS]
    assert not unknown, "fences must say python, bash, sh, console or text: " + ", ".join(unknown)
    not_run = [f"{b.where} ({b.not_run})" for b in ALL_BLOCKS if b.not_run is not None]
    assert len(not_run) <= MAX_NOT_RUN, f"{len(not_run)} blocks marked not-run: " + ", ".join(not_run)
    text = [b.where for b in ALL_BLOCKS if b.lang in SHOWN_LANGS]
    assert len(text) <= MAX_TEXT, f"{len(text)} ```text blocks (at most {MAX_TEXT}): " + ", ".join(text)


LIST_ITEM = re.compile(r"\s*([-*+]|\d+\.)\s")


def indented_code_lines(doc: Path) -> "list[int]":
    """First lines of Markdown's indented code blocks: indented 4, after a blank line, outside fences and lists."""
    found, in_fence, in_list, after_blank = [], False, False, True
    for number, line in enumerate(doc.read_text().split("\n"), 1):
        if line.startswith("```"):
            in_fence, after_blank = not in_fence, False
            continue
        if in_fence:
            continue
        if not line.strip():
            after_blank = True
            continue
        if LIST_ITEM.match(line):
            in_list = True
        elif after_blank and not line.startswith(" "):
            in_list = False
        if after_blank and line.startswith("    ") and not in_list:
            found.append(number)
        after_blank = False
    return found


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(REPO)))
def test_no_indented_code_blocks(doc):
    lines = indented_code_lines(doc)
    assert not lines, f"{doc.relative_to(REPO)}: indented code at lines {lines}: fence it (```bash, ```text, ...)"


# ---- python blocks

@pytest.mark.parametrize("block", blocks_to("run"), ids=lambda b: b.where)
def test_python_example_runs(block, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(block.text + "\n")
    out = run_command([sys.executable, script], timeout=600)
    failed_at = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', out.stdout)
    where = f"{block.doc.relative_to(REPO)}:{block.line + int(failed_at[-1])}" if failed_at else block.where
    assert out.returncode == 0, f"{where}: the example fails (exit {out.returncode}):\n{out.stdout[-3000:]}"


# ---- shell blocks

def command_lines(block: Block) -> "list[tuple[int, list[str]]]":
    """(line number, words) of each command in a shell block; continuation lines joined, comments dropped."""
    commands, pending, first = [], "", None
    for number, line in enumerate(block.text.split("\n"), block.line + 1):
        if block.lang == "console":
            if not (line.startswith("$ ") or pending):
                continue
            line = line[2:] if not pending else line
        first = first if pending else number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            commands.append((first, words))
    return commands


def as_typed(words: "list[str]") -> "list[str]":
    """A documented command line as a user would type it: [--opt] -> --opt, a|b -> a, '...' dropped."""
    typed = []
    for word in words:
        word = word.strip("[]")
        if word in ("...", ""):
            continue
        if "|" in word and not word.startswith("-"):
            word = word.split("|")[0]
        typed.append(word)
    return typed


@cache
def installed_commands() -> "dict[str, str]":
    """mxnet-pfc-NAME -> the module whose main it runs (pyproject.toml)."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


@cache
def make_targets() -> "set[str]":
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.MULTILINE))


class _Parsed(Exception):
    pass


def parse_error(module: str, args: "list[str]") -> "str | None":
    """What the command's own parser says of `args` (None: accepted). Its main runs only up to the parse."""
    if module == "mxnet_pfc.train":
        from mxnet_pfc.training import config as config_lib
        with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
            try:
                config_lib.parse_args(args)          # argparse, then the presets and every check of the values
            except config_lib.ConfigError as error:
                return str(error)
            except SystemExit as stop:
                return None if stop.code == 0 else err.getvalue().strip().split("\n")[-1]
        return None
    if module == "mxnet_pfc.elastic" and "--" in args:
        split = args.index("--")
        return parse_error(module, args[:split]) or parse_error("mxnet_pfc.train", args[split + 1:])
    real_parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, argv=None, namespace=None):
        real_parse(parser, argv, namespace)
        raise _Parsed

    main = import_module(module).main
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
        except _Parsed:
            return None
        except SystemExit as stop:
            return None if stop.code == 0 else err.getvalue().strip().split("\n")[-1]
    return f"{module}.main returned without parsing its arguments"


def resolve(words: "list[str]") -> "tuple[str, list[str]] | None":
    """(module, arguments) of a project command line, None for another program's (OTHER_COMMANDS)."""
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0], flags=re.DOTALL):     # VAR=value before the command
        words = words[1:]
    head, rest = words[0], words[1:]
    if head in ("python", "python3") and rest[:1] == ["-m"]:
        return rest[1], rest[2:]
    if head in installed_commands():
        return installed_commands()[head], rest
    if head == "bash" and rest[:1] in (["config.sh"], ["run.sh"]):
        return "mxnet_pfc.train", rest[2:] if rest[1:2] == ["--"] else rest[1:]
    if head in ("horovodrun", "srun"):
        launched = next((i for i, w in enumerate(rest) if w in ("bash", "python", "python3")), None)
        assert launched is not None, f"{head} launches neither config.sh nor python: {words}"
        return resolve(rest[launched:])
    if head == "sbatch" and any(w.endswith("slurm.sbatch") for w in rest):
        script = next(i for i, w in enumerate(rest) if w.endswith("slurm.sbatch"))
        assert (REPO / rest[script]).is_file(), f"sbatch submits {rest[script]}, which is not in the repository"
        trainer = rest[script + 1:]
        return "mxnet_pfc.train", trainer[1:] if trainer[:1] == ["--"] else trainer
    if head == "make":
        targets = [w for w in rest if "=" not in w]
        unknown = [t for t in targets if t not in make_targets()]
        assert not unknown, f"make has no target {unknown}"
        trainer_args = [w.split("=", 1)[1] for w in rest if w.startswith("ARGS=")]
        return ("mxnet_pfc.train", shlex.split(trainer_args[0])) if targets == ["run"] and trainer_args else None
    assert head in OTHER_COMMANDS, f"{head!r} is neither a command of this project nor in OTHER_COMMANDS"
    return None


@pytest.mark.parametrize("block", blocks_to("check"), ids=lambda b: b.where)
def test_shell_example_names_real_commands_and_options(block):
    for number, words in command_lines(block):
        where = f"{block.doc.relative_to(REPO)}:{number}"
        try:
            resolved = resolve(as_typed(words))
        except AssertionError as error:
            raise AssertionError(f"{where}: {error}") from None
        if resolved is None:
            continue
        module, args = resolved
        assert module.startswith("mxnet_pfc.") and hasattr(import_module(module), "main"), \
            f"{where}: {module} is not a command (no main)"
        error = parse_error(module, args)
        assert error is None, f"{where}: {module} refuses {shlex.join(args)!r}: {error}"
        if module in CHEAP_MODULES or "--help" in args:
            out = run_command([sys.executable, "-m", module, *args], timeout=120)
            assert out.returncode == 0, f"{where}: exit {out.returncode}:\n{out.stdout[-2000:]}"


# ---- links and paths

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?<![\w./-])((?:mxnet_pfc|symbols|tests|docs|benchmarks|setup-utils)/[\w./-]*[\w/])")
FILE_NAME = re.compile(r"(?<![\w./*-])([\w-]+\.(?:py|sh|cc|md|toml))\b")
NOT_OURS = {"hosts.sh": "the user's discovery script", "ijb_11.py": "InsightFace's IJB script",
            "sitecustomize.py": "Python's start-up hook, which a test writes"}


def anchors(doc: Path) -> "set[str]":
    """GitHub's ids of a document's headings."""
    titles = re.findall(r"^#+\s+(.*)$", doc.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in titles}


@cache
def file_names() -> "set[str]":
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    return {Path(path).name for path in listed.split()}


def ignored(path: str) -> bool:
    """Whether git ignores `path`: what a run writes (output/, benchmarks/results/), named before it exists."""
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False).returncode == 0


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(REPO)))
def test_links_and_named_files_exist(doc):
    missing = []
    for number, line in enumerate(doc.read_text().split("\n"), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                missing.append(f"{number}: link to {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                missing.append(f"{number}: no heading #{anchor} in {linked.relative_to(REPO)}")
        for path in REPO_PATH.findall(line):
            if not (REPO / path).exists() and not ignored(path):
                missing.append(f"{number}: {path}")
        for name in FILE_NAME.findall(line):
            if name not in file_names() and name not in NOT_OURS:
                missing.append(f"{number}: {name} (no file of that name in the repository)")
    assert not missing, f"{doc.relative_to(REPO)}: " + "; ".join(missing)
