"""The textual pass that turns preprocessed MSL into C++ the shim headers can compile.

The pass is deliberately tiny; everything else is done by the headers (address-space keywords
are empty macros, see include/mf_sim/keywords.h).  Line numbers never change: removed text is
replaced by spaces, so compiler messages point at the user's lines.  The rewrites, exactly:

1. Metal attributes ``[[...]]`` (``[[buffer(0)]]``, ``[[thread_position_in_grid]]``,
   ``[[kernel]]``, ``[[host_name("x")]]``, ``[[max_total_threads_per_threadgroup(N)]]``, ...)
   are blanked.  Standard C++ attributes (``[[maybe_unused]]``, ``[[likely]]``, ...) stay.
2. A statement-level ``threadgroup`` variable declaration inside a function body
   (``threadgroup float buf[256];``: no ``*``, ``&``, ``=`` or ``(`` in it) becomes
   ``static thread_local float buf[256];``.  Each worker OS thread runs one threadgroup at a
   time and all fibers of that group live on that OS thread, so this storage is exactly the
   group's shared memory.  Like Metal's, it is not initialised between groups.  After the
   declaration's ``;`` (on the same line) comes ``::mf::tg_note(buf, "buf", __FILE__,
   __LINE__);`` for each declared name: it tells the race detector (include/mf_sim/race.h) where
   this thread's copy of the array lives, its shape and its name.
3. Explicit instantiations carrying ``[[host_name("...")]]`` (all three forms) are blanked
   whole; the generated trampoline names the instantiation instead, which instantiates it.
4. A function constant, ``constant T name [[function_constant(n)]];``, becomes
   ``static constexpr T name = ::mf::function_constant<T, n>();`` plus the flag that
   ``is_function_constant_defined(name)`` reads.  The values come from specialisations of
   ``mf::fc_value<n>`` that `Library` puts before the source (see include/mf_sim/constants.h).
5. ``constant`` next to ``const`` (``const constant T*``, ``constant const char*``) is blanked:
   ``constant`` is the macro ``const`` (keywords.h), so a ``constant`` pointer is read-only as on
   Metal and overloads on ``constant`` vs ``device`` pointers stay distinct, and C++ would
   reject the doubled ``const``.
"""
from __future__ import annotations

from ..msl.blanks import blanked, single_const
from ..msl.signature import ParsedSource

TG_REPLACEMENT = "static thread_local"


def tg_notes(names: list[str]) -> str:
    """The statements that register threadgroup arrays `names` with the race detector."""
    return "".join(f' ::mf::tg_note({n}, "{n}", __FILE__, __LINE__);' for n in names)


def rewrite(text: str, parsed: ParsedSource) -> str:
    out = blanked(text, parsed)
    # replacements, back to front so offsets stay valid; line counts never change
    edits: set[tuple[int, int, str]] = set()
    for d in parsed.tg_decls:
        if out[d.start:d.end] == "threadgroup":
            edits.add((d.start, d.end, TG_REPLACEMENT))
            if d.names and d.stmt_end:
                edits.add((d.stmt_end, d.stmt_end, tg_notes(d.names)))
    for fc in parsed.function_constants:
        decl = (f"static constexpr {fc.type_text} {fc.name} = "
                f"::mf::function_constant<{fc.type_text}, {fc.index}>(); "
                f"static constexpr bool mf_fc_defined_{fc.name} = "
                f"::mf::fc_value<{fc.index}>::defined;")
        edits.add((fc.start, fc.end, decl + "\n" * out.count("\n", fc.start, fc.end)))
    for a, b, new in sorted(edits, reverse=True):
        out = out[:a] + new + out[b:]
    return single_const(out)
