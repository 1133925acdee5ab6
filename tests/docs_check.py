"""Run every shell command of the documentation, so the docs cannot rot.

Scanned: README.md, jobs/README.md and docs/**/*.md. A fenced block is a shell block when it is
tagged ``bash``, ``sh``, ``shell`` or ``console``, or untagged with a first line that starts
with a command (``mpiexec``, ``python``, ...). Lines ending in a backslash are joined, and
``A && B`` runs as A, then B. Each file's commands run in order, one ``bash`` each, in a fresh
directory holding copies of ``jobs/``, ``benchmarks/`` and ``docs/`` (so commands that write
results write into the copy), with this checkout first on ``PYTHONPATH``; every one must exit 0.

A block may be preceded by an HTML comment (invisible on the rendered page) with directives,
one a line:

    <!-- docs-check
    setup: COMMAND           run first, not shown to readers (make the run a command resumes)
    tiny: OLD => NEW         the block is long: run each command with OLD replaced by NEW
    skip: TEXT -- REASON     commands containing TEXT are not run, for the reason given
    needs: MODULE ...        the block runs only where these optional packages are installed
                             (e.g. torch); elsewhere its commands are reported as skipped
    -->

A ``tiny`` or ``skip`` that matches no command of its block is an error, so markers cannot
outlive their commands.

    python -m tests.docs_check [FILE ...]      # run them (all files by default), print timings
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]
SHELL_TAGS = ("bash", "sh", "shell", "console")
COMMAND_WORDS = ("mpiexec", "mpirun", "srun", "python", "python3", "bash", "hpcopt", "for", "pip")
COPIED = ("jobs", "benchmarks", "docs", "README.md")
#: Seconds one command may take (the reproductions' short runs take ~100 s on a loaded 2-core
#: machine); scaled by HPCOPT_TEST_TIMEOUT_SCALE (tests/timeouts.py).
TIMEOUT = scaled(300)


@dataclass
class Block:
    path: Path
    line: int                      # of the opening fence, 1-based
    commands: list[str]
    setup: list[str] = field(default_factory=list)
    tiny: list[tuple[str, str]] = field(default_factory=list)
    skip: list[tuple[str, str]] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)

    def missing(self) -> list[str]:
        """The optional packages this block needs that are not installed."""
        return [name for name in self.needs if importlib.util.find_spec(name) is None]


@dataclass
class Outcome:
    block: Block
    command: str                   # as run (after tiny replacements)
    skipped: str = ""              # the reason, when not run
    returncode: int = 0
    seconds: float = 0.0
    output: str = ""
    missing: bool = False          # skipped because an optional package is not installed

    @property
    def failed(self) -> bool:
        return not self.skipped and self.returncode != 0

    def describe(self) -> str:
        where = f"{_name(self.block.path)}:{self.block.line}"
        if self.skipped:
            return f"{where}: skipped ({self.skipped}): {self.command}"
        status = "ok" if not self.failed else f"FAILED (exit {self.returncode})"
        return f"{where}: {status} in {self.seconds:.1f} s: {self.command}"


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "jobs" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _directives(lines: list[str], fence: int) -> dict[str, list[str]]:
    """The ``docs-check`` comment right above line index ``fence`` (blank lines allowed between)."""
    end = fence - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return {}
    start = end
    while start >= 0 and "<!--" not in lines[start]:
        start -= 1
    text = "\n".join(lines[start:end + 1]).strip()
    if not text.startswith("<!-- docs-check"):
        return {}
    body = text.removeprefix("<!-- docs-check").removesuffix("-->").lstrip(":")
    found: dict[str, list[str]] = {"setup": [], "tiny": [], "skip": [], "needs": []}
    for item in filter(None, (line.strip() for line in body.splitlines())):
        key, sep, value = item.partition(":")
        if not sep or key.strip() not in found:
            raise ValueError(f"unknown docs-check directive {item!r}")
        found[key.strip()].append(value.strip())
    return found


def _is_shell(tag: str, body: list[str]) -> bool:
    if tag in SHELL_TAGS:
        return True
    first = next((line.split()[0] for line in body if line.strip()), "")
    return tag == "" and first in COMMAND_WORDS


def _commands(body: list[str]) -> list[str]:
    joined, pending = [], ""
    for line in body:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        text = (pending + line.strip()).strip()
        pending = ""
        if text and not text.startswith("#"):
            joined.append(text.removeprefix("$ "))
    out = []
    for command in joined:
        if command.startswith("for "):
            out.append(command)
        else:
            out += [part.strip() for part in command.split(" && ")]
    return out


def find_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        body = lines[i + 1:end]
        if _is_shell(match.group(1), body):
            where = f"{_name(path)}:{i + 1}"
            try:
                found = _directives(lines, i)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            block = Block(path, i + 1, _commands(body), found.get("setup", []),
                          needs=[name for item in found.get("needs", []) for name in item.split()])
            for item in found.get("tiny", []):
                old, sep, new = item.partition("=>")
                if not sep:
                    raise ValueError(f"{where}: tiny needs OLD => NEW, got {item!r}")
                block.tiny.append((old.strip(), new.strip()))
            for item in found.get("skip", []):
                text, sep, reason = item.partition(" -- ")
                if not sep or not reason.strip():
                    raise ValueError(f"{where}: skip needs TEXT -- REASON, got {item!r}")
                block.skip.append((text.strip(), reason.strip()))
            for kind, pairs in (("tiny", block.tiny), ("skip", block.skip)):
                for text, _ in pairs:
                    if not any(text in command for command in block.commands):
                        raise ValueError(f"{where}: {kind} {text!r} matches no command of the block")
            blocks.append(block)
        i = end + 1
    return blocks


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("MPLBACKEND", "Agg")
    return env


def _run(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, float, str]:
    start = time.perf_counter()
    try:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = 124, f"timed out after {TIMEOUT:.0f} s: {exc}"
    return code, time.perf_counter() - start, output


def run_file(path: Path, workdir: Path) -> list[Outcome]:
    """Run the commands of ``path`` in order inside ``workdir`` (made here)."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, workdir / name, ignore=shutil.ignore_patterns("generated", "__pycache__"))
        elif source.exists():
            shutil.copy(source, workdir / name)
    env = _environment()
    outcomes = []
    for block in find_blocks(path):
        missing = block.missing()
        if missing:
            reason = f"needs {', '.join(missing)}, which is not installed"
            outcomes += [Outcome(block, command, reason, missing=True) for command in block.commands]
            continue
        for command in block.setup:
            code, seconds, output = _run(command, workdir, env)
            outcomes.append(Outcome(block, f"(setup) {command}", "", code, seconds, output))
        for command in block.commands:
            reason = next((why for text, why in block.skip if text in command), "")
            for old, new in block.tiny:
                command = command.replace(old, new)
            if reason:
                outcomes.append(Outcome(block, command, reason))
                continue
            code, seconds, output = _run(command, workdir, env)
            outcomes.append(Outcome(block, command, "", code, seconds, output))
    return outcomes


def main(argv: list[str]) -> int:
    import tempfile

    files = [Path(a).resolve() for a in argv] or doc_files()
    failed = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(files):
            for outcome in run_file(path, Path(tmp) / str(i)):
                print(outcome.describe(), flush=True)
                if outcome.failed:
                    failed += 1
                    print("    " + "\n    ".join(outcome.output.strip().splitlines()[-8:]), flush=True)
    print(f"{failed} failed; {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
