"""The doctor's report: one JSON document (schema below, versioned) and the same as Markdown,
with the user's home directory, working directory and Python prefix replaced by `~`, `.` and
`<python>` so that it can be shared as is.

JSON schema 1::

    {"schema": 1, "machine": {...machine.facts...}, "options": {...},
     "summary": {"checked": N, "failed": N, "by_status": {"ok": N, ...}},
     "results": [{"kernel", "family", "dtype", "status", "seconds", "examples",
                  "instantiations": [...], "message", "source_line", "bench": {...}}]}
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .run import Result

SCHEMA = 1
MESSAGE_CHARS = 6000          # a failure's message in the report (the start: what and where)


def scrub(text: str) -> str:
    """`text` with personal paths replaced."""
    for path, name in ((sys.prefix, "<python>"), (os.getcwd(), "."), (str(Path.home()), "~")):
        if path and len(path) > 1:
            text = text.replace(path, name)
    return text


def _result(r: Result) -> dict[str, Any]:
    d = asdict(r)
    d["message"] = scrub(r.message[:MESSAGE_CHARS])
    d["source_line"] = scrub(r.source_line)
    d["instantiations"] = [scrub(i) for i in r.instantiations]
    return d


def document(machine: dict[str, Any], options: dict[str, Any],
             results: list[Result]) -> dict[str, Any]:
    statuses = Counter(r.status for r in results)
    return {"schema": SCHEMA, "machine": {k: scrub(str(v)) if isinstance(v, str) else v
                                          for k, v in machine.items()},
            "options": options,
            "summary": {"checked": len(results), "failed": sum(r.failed for r in results),
                        "by_status": dict(statuses)},
            "results": [_result(r) for r in results]}


def _us(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, (int, float)) else "-"


def markdown(doc: dict[str, Any]) -> str:
    m, s = doc["machine"], doc["summary"]
    lines = ["# metalforge doctor report", "",
             "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in m.items()]
    lines += ["", f"**{s['checked']} checked, {s['failed']} failed** "
              f"({', '.join(f'{k}: {v}' for k, v in sorted(s['by_status'].items()))})", "",
              "| kernel | family | dtype | status | examples | s | ours µs | torch µs | MLX µs |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        b = r["bench"]
        lines.append(f"| {r['kernel']} | {r['family']} | {r['dtype']} | {r['status']} | "
                     f"{r['examples']} | {r['seconds']:.1f} | {_us(b.get('ours_us'))} | "
                     f"{_us(b.get('torch_us'))} | {_us(b.get('mlx_us'))} |")
    failed = [r for r in doc["results"] if r["status"] != "ok"]
    if failed:
        lines += ["", "## Failures", ""]
    for r in failed:
        lines += [f"### {r['kernel']} ({r['dtype']}): {r['status']}", ""]
        if r["source_line"]:
            lines += [f"Source line: `{r['source_line']}`", ""]
        lines += ["```", r["message"], "```", ""]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], json_path: Path) -> Path:
    """Write the JSON and, beside it, the Markdown (same name, .md); returns the .md path."""
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    md = json_path.with_suffix(".md")
    md.write_text(markdown(doc))
    return md
