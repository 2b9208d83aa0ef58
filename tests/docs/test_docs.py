"""Every fenced ```python block in README.md and docs/ runs, so an example that stops working
fails the suite.

The blocks of one Markdown file run in order as one script (like a notebook: a block may use
what an earlier block of the same file defined), written to a temporary .py file so that
`@mf.kernel` can read its functions' source and report user lines. A block that needs hardware
this machine lacks says so on the line just above its fence:

    <!-- requires: mps -->      an Apple GPU (torch.backends.mps.is_available())
    <!-- requires: cuda -->     an NVIDIA GPU (torch.cuda.is_available())
    <!-- requires: mlx -->      the mlx package

and is left out (not replaced) when the requirement is not met. A failure names the Markdown
file and line of the failing block's statement.
"""
from __future__ import annotations

import importlib.util
import re
import runpy
import traceback
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_REQUIRES = re.compile(r"^<!--\s*requires:\s*(\w+)\s*-->$")


def _available(what: str) -> bool:
    if what == "mps":
        return torch.backends.mps.is_available()
    if what == "cuda":
        return torch.cuda.is_available()
    if what == "mlx":
        return importlib.util.find_spec("mlx") is not None
    raise ValueError(f"unknown requirement {what!r}")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(first line number of the code, code, requirement) of each ```python block."""
    blocks = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        lang, start = m.group(1), i + 1
        prev = lines[i - 1].strip() if i else ""
        req = _REQUIRES.match(prev)
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if lang == "python":
            blocks.append((start + 1, "\n".join(lines[start:end]), req.group(1) if req else None))
        i = end + 1
    return blocks


def script(doc: Path) -> tuple[str, list[tuple[int, int]]]:
    """The runnable blocks of `doc` as one script, and (script line, doc line) of each block."""
    out: list[str] = []
    starts: list[tuple[int, int]] = []
    for line, code, req in python_blocks(doc.read_text()):
        if req and not _available(req):
            continue
        starts.append((len(out) + 1, line))
        out += code.split("\n")
    return "\n".join(out) + "\n", starts


def _doc_line(script_line: int, starts: list[tuple[int, int]]) -> int:
    s0, d0 = max((s for s in starts if s[0] <= script_line), default=(1, 1))
    return d0 + script_line - s0


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(doc: Path, tmp_path, monkeypatch):
    code, starts = script(doc)
    if not starts:
        pytest.skip("no runnable python blocks")
    path = tmp_path / (doc.stem.replace("-", "_") + "_blocks.py")
    path.write_text(code)
    monkeypatch.chdir(ROOT)
    try:
        runpy.run_path(str(path), run_name="__main__")
    except Exception as e:   # report the Markdown line, not the temporary script's
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        where = f"{doc.relative_to(ROOT)}:{_doc_line(frames[-1].lineno, starts)}" \
            if frames and frames[-1].lineno else str(doc.relative_to(ROOT))
        raise AssertionError(f"{where}: a documented example failed: "
                             f"{type(e).__name__}: {e}") from e


def test_block_parser_sees_requirements():
    text = ("x\n<!-- requires: cuda -->\n```python\na = 1\n```\n"
            "```bash\nls\n```\n```python\nb\n```\n")
    assert python_blocks(text) == [(4, "a = 1", "cuda"), (10, "b", None)]


def test_grammar_in_reference_is_the_shipped_grammar():
    doc = (ROOT / "docs" / "reference" / "annotations.md").read_text()
    block = re.search(r"```lark\n(.*?)```", doc, re.S)
    assert block, "docs/reference/annotations.md shows the grammar in a ```lark block"
    shipped = (ROOT / "metalforge" / "frontend" / "metalforge.lark").read_text()
    assert block.group(1).strip() == shipped.strip()
