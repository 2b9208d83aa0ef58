"""bench/floors.py's rows, elementwise and columns parts edit the source the cuda backend
compiles: every edit applies at every case's shape (the cuda launch table, no GPU), the edited
text is what it says (no per-element math left, folds as adds, one row per chunk), it still
compiles (the cuda translation's host syntax check), and an edit whose text is gone stops with
its name instead of timing the kernel as generated."""
import re
import sys
from pathlib import Path

import pytest

from ..cuda_host import assert_host_syntax

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import floors_bw  # noqa: E402


def _edited(src: str, mode: str) -> str:
    for edit in floors_bw.EDITS[mode]:
        src = edit(src)
    return src


def test_every_edit_applies_at_every_case():
    for part, modes in floors_bw.PARTS.items():
        lines = floors_bw.check(part)
        cases = list(floors_bw.cases(part, "meta"))
        assert len(lines) == len(cases) * (len(modes) - 1), part


def _source(part: str, name: str, dtype: str, spec: str) -> str:
    case = next(c for c in floors_bw.cases(part, "meta") if c[:3] == (name, dtype, spec))
    return floors_bw.cuda_source(case[3], case[4])


def test_edited_text(tmp_path):
    from metalforge.cuda.translate import translate
    ln = _source("rows", "layer_norm", "f16", "64x65536")
    assert "kernel void mf_layer_norm_split(" in ln     # the cuda table: split rows
    flat = _edited(ln, "no math, folds as adds")
    values = re.findall(r"const float mf_v\d+ = (.*);", flat)
    assert values and all(re.fullmatch(r"[\w\[\] +]+", v) for v in values)
    assert "mf_sum_add(" not in "".join(floors_bw.bodies(flat))
    assert "mf_in_w" in flat and "mf_in_b" in flat    # every input still reaches the store
    assert_host_syntax(translate(flat).text, tmp_path)
    silu = _edited(_source("elementwise", "silu", "bf16", "8192x8192"), "identity")
    assert "exp(" not in "".join(floors_bw.bodies(silu))
    assert set(re.findall(r"const float mf_v\d+ = (.*);", silu)) == {"mf_in_x"}
    col = _edited(_source("columns", "column_max", "f16", "4096x128"), "one row per chunk")
    assert "const uint mf_k1 = mf_k0 + 1u;" in col and "mf_i < 1u" in col
    assert_host_syntax(translate(col).text, tmp_path)


def test_an_edit_whose_text_is_gone_stops_with_its_name():
    for mode, text in (("no math", "kernel void k() {\n}\n"),
                       ("folds as adds", "kernel void k() {\n}\n"),
                       ("one row per chunk", "")):
        with pytest.raises(SystemExit, match=f"edit '{mode}'"):
            _edited(text, mode)
    odd = "kernel void k() {\n    mf_acc1 = mf_sum_add(mf_cmp1, mf_acc1);\n" \
          "    mf_acc2 = fmax(mf_acc2, mf_in_x);\n}\n"
    with pytest.raises(SystemExit, match="form it does not know"):
        floors_bw.folds_as_adds(odd)


def test_prefill_phase_edits(tmp_path):
    """bench/floors.py --parts prefill: each phase edit applies to the prefill kernels the cuda
    backend compiles at both cases (the main kernel and its narrow twin), touches those
    kernels only, and still compiles."""
    import floors_prefill

    from metalforge.cuda.translate import translate
    assert len(floors_prefill.check()) == len(floors_prefill.CASES) * len(floors_prefill.EDITS)
    src = floors_prefill.source()[0]
    first = min(src.find(k) for k in floors_prefill.KERNELS)
    out = src
    for edit in floors_prefill.EDITS["products only"] + floors_prefill.EDITS["no P·V products"]:
        out = edit(out)
    assert out[:first] == src[:first]
    for kernel in floors_prefill.KERNELS:
        i = out.find(kernel)
        body = out[i:out.find("template [[host_name(", i)]
        assert "mf_p_op.run(" in src[src.find(kernel):]
        assert "mf_p_op.run(" not in body and "*reinterpret_cast<device const" not in body
    assert "fast::exp(" in floors_prefill.fast_exp(src)[first:]
    assert_host_syntax(translate(out).text, tmp_path, metal_version=400)


def test_backward_phase_edits(tmp_path):
    """bench/floors.py --parts backward: each edit applies to the wide kernels of the attention
    backward the cuda backend compiles, touches nothing else, takes out what it names, and the
    edited source still compiles; text the edits look for going away stops them."""
    import floors_backward

    from metalforge.cuda.translate import translate
    src = floors_backward.source()
    assert len(floors_backward.check()) == len(floors_backward.EDITS)
    out = floors_backward.no_gradients(floors_backward.no_scores(floors_backward.plain(src)))
    first = floors_backward.KERNEL.search(src).start()
    assert out[:first] == src[:first]
    for kind in ("dkdv", "dq"):
        i = out.index(f"_{kind}_wide(")
        body = out[i:out.index("template [[host_name(", i)]
        assert "mf_sres_op.run(" not in body and "mf_racc_op.run(" not in body
        assert "mf_w0 = mf_sd;" in body and "precise::exp" in src[src.index(f"_{kind}_wide("):]
    assert "mf_racc_op.run(" in src and "mf_sres_op.run(" in src
    assert_host_syntax(translate(out).text, tmp_path, metal_version=400)
    with pytest.raises(SystemExit, match="plain P / dS"):
        floors_backward.plain(re.sub(r"mf_w[01] = mf_g\d+;", "", src))
