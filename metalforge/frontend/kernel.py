"""`@mf.kernel` and the Kernel object: parameters from annotations, argument binding, one
traced Graph per specialisation (dtype variables + Const values), and the calls into the
runtime (run/source/ir) and the reference."""
from __future__ import annotations

import ast
import copy
import inspect
import re
import textwrap
from dataclasses import replace
from typing import Any, Callable, Mapping, Optional, Union, cast

import torch

from .. import dtypes, runtime
from ..dtypes import BOOL, F32, I64, DType, check_float, check_int64
from ..errors import AnnotationError, BindingError, TraceError, UnsupportedConstruct, at, kernel_at
from ..graph import AxisSpec, ConstParam, Graph, Node, Op, Output, Param, ScalarParam, TensorParam
from ..once import OnceMap
from ..runtime.fastpath import MISS
from ..torch_ops import register
from ..tuning.launch import check_options
from .annotations import Annotation, parse_annotation, resolve_dims, unify_literals, with_literals
from .tracer import Sym, Trace

SCALAR_DTYPES = {float: F32, int: I64, bool: BOOL}
# a specialisation: ((dtype variable, dtype name), ...), ((Const, value), ...))
Key = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, Any], ...]]
_CONST_TEXT = re.compile(r"^(?:[A-Za-z_]\w*\.)*Const\[\s*(int|bool)\s*\]$")


class _ConstType:
    def __init__(self, pytype: type):
        self.pytype = pytype

    def __repr__(self) -> str:
        return f"mf.Const[{self.pytype.__name__}]"


class Const:
    """`mf.Const[int]` / `mf.Const[bool]`: a compile-time constant parameter. Inside the kernel
    it is a plain Python value; each distinct value is its own specialised variant.

    Example::

        @mf.kernel
        def masked(x: "T[S, L]", causal: mf.Const[bool] = True):
            if causal:              # decided while tracing: one kernel per value
                x = mf.where(mf.index("L") <= mf.index("S"), x, -mf.inf)
            return x
    """

    def __class_getitem__(cls, pytype: Any) -> _ConstType:
        if pytype not in (int, bool):
            raise TraceError(f"mf.Const[{getattr(pytype, '__name__', pytype)}]: only "
                             "mf.Const[int] and mf.Const[bool] exist")
        return _ConstType(pytype)


def _unquote(ann: str) -> str:
    """An annotation string as written: under `from __future__ import annotations` Python keeps
    `x: "T[N]"` as the text `'T[N]'`, quotes included."""
    text = ann.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        value = ast.literal_eval(text)
        if isinstance(value, str):
            return value.strip()
    return text


# --------------------------------------------------------------------------- source locations

def _locate(fn: Callable[..., Any]) -> tuple[str, int, dict[str, int]]:
    """(file, def line, {parameter: line of its annotation}) of a function."""
    file = inspect.getsourcefile(fn) or fn.__code__.co_filename
    line = fn.__code__.co_firstlineno
    lines: dict[str, int] = {}
    try:
        src, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(src)))
        fdef = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                                  ast.AsyncFunctionDef)))
        line = start + fdef.lineno - 1
        a = fdef.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs:
            lines[arg.arg] = start + (arg.annotation or arg).lineno - 1
        if fdef.returns is not None:
            lines["return"] = start + fdef.returns.lineno - 1
    except (OSError, TypeError, SyntaxError, StopIteration):
        pass        # no source (e.g. exec'd code): the code object's line is the best we have
    return file, line, lines


# --------------------------------------------------------------------------- the kernel

# generated names are mf_<name>_<variant>: no "__" there either (reserved in C++)
_NAME = re.compile(r"(?=.{1,64}$)[A-Za-z](?:_?[A-Za-z0-9])*")


def _check_name(name: Optional[str], fn: Callable[..., Any], loc: tuple[str, int]) -> str:
    """The kernel's name, which generated MSL uses in function names, host names and comments:
    a plain ASCII identifier, else a ValueError."""
    got = fn.__name__ if name is None else name
    if isinstance(got, str) and _NAME.fullmatch(got):
        return got
    src = "name=" if name is not None else "the function's __name__"
    raise UnsupportedConstruct(
        f"kernel{at(loc)}: {src} {got!r} cannot name a Metal kernel; "
        f"use a plain identifier (ASCII letters and digits, single '_' between them, "
        f"a letter first, at most 64 characters), e.g. "
        f"@mf.kernel(name=\"my_kernel\")")


class Kernel:
    """A traced, lowered, runnable metalforge kernel (what `@mf.kernel` returns).

    Call it to run (`out=t` / `out=(t0, t1)` writes the outputs into your tensors, views at an
    offset included, and returns them; see `kernel(inplace=...)`); `.source(*args)` /
    `.ir(*args)` show the Metal source / lowered kernel of the specialisation the arguments
    select; `.reference(*args)` evaluates the same description with
    torch; `.variants()`, `.with_launch(...)`, `.as_op("ns::name")`, `.backward_source(...)`.

    Example::

        y = silu(x)                      # MPS → Metal, CPU → simulator, CUDA → NVRTC
        silu(x, out=cache[pos])          # written into a row of a preallocated cache
        print(silu.source(x))
        torch.testing.assert_close(y, silu.reference(x))
    """

    def __init__(self, fn: Callable[..., Any], *, name: Optional[str] = None,
                 backend: Optional[str] = None, launch: Optional[Mapping[str, Any]] = None,
                 inplace: Union[None, str, Mapping[int, str]] = None):
        self.fn = fn
        self.backend = backend
        self.launch = None
        file, line, self._lines = _locate(fn)
        self.loc = (file, line)
        self.name = _check_name(name, fn, self.loc)
        self.signature = inspect.signature(fn)
        self._annotations: dict[str, Annotation] = {}
        self.params = self._declare()
        self.dtype_vars = tuple(dict.fromkeys(
            p.dtype_var for p in self.params if isinstance(p, TensorParam) and p.dtype_var))
        self.dims = tuple(dict.fromkeys(
            n for a in self._annotations.values() for d in a.dims for n in d.names
            if n not in self._const_names))
        self._return = self._declare_return()
        self._graphs: OnceMap[Key, Graph] = OnceMap()     # one trace per key, shared by views
        if launch:
            self.launch = check_options(launch, f"{self.where}, launch=")
        self.inplace = runtime.outputs.declare_inplace(
            inplace, [p.name for p in self.params if isinstance(p, TensorParam)],
            f"{self.where}, inplace=")
        self._declare_call()
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<metalforge kernel {self.name} ({self.loc[0]}:{self.loc[1]})>"

    # -- declaration --------------------------------------------------------------------
    @property
    def where(self) -> str:
        return kernel_at(self.name, self.loc)

    def _pwhere(self, pname: str) -> str:
        line = self._lines.get(pname, self.loc[1])
        return f"{kernel_at(self.name, (self.loc[0], line))}, parameter '{pname}'"

    def _declare(self) -> tuple[Param, ...]:
        """The parameters, from the signature's annotations: runtime scalars, Consts, tensors
        (their dims resolved with stand-in Const values, so bad annotations fail here)."""
        params = [self._declare_param(p) for p in self.signature.parameters.values()]
        self._const_names = {p.name: p for p in params if isinstance(p, ConstParam)}
        out = self._resolve_dims(params)
        self._check_batch_names(out)
        return out

    def _declare_param(self, p: inspect.Parameter) -> Param:
        """One parameter, by its annotation: float/int/bool, mf.Const[...], or a tensor."""
        where = self._pwhere(p.name)
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise AnnotationError(f"{where}: *args/**kwargs are not supported; declare "
                                  "each argument with an annotation")
        ann = p.annotation
        has_default = p.default is not inspect.Parameter.empty
        if ann is inspect.Parameter.empty:
            raise AnnotationError(f"{where}: needs an annotation: a tensor like \"T[N]\", "
                                  "float/int/bool for a runtime scalar, or mf.Const[int]")
        text = _unquote(ann) if isinstance(ann, str) else None
        if ann in (float, int, bool) or text in ("float", "int", "bool"):
            pytype = ann if not text else {"float": float, "int": int, "bool": bool}[text]
            if has_default:
                self._check_scalar(pytype, p.default, where + " (default)")
            return ScalarParam(p.name, pytype, SCALAR_DTYPES[pytype],
                               p.default if has_default else None, has_default)
        m = _CONST_TEXT.match(text) if text else None
        if isinstance(ann, _ConstType) or m:
            pytype = ann.pytype if isinstance(ann, _ConstType) else \
                {"int": int, "bool": bool}[m.group(1) if m else ""]
            if has_default:
                self._check_const(pytype, p.default, where + " (default)")
            return ConstParam(p.name, pytype, p.default if has_default else None, has_default)
        if text is None:
            raise AnnotationError(
                f"{where}: unsupported annotation {ann!r}; use a string like \"T[N]\" for "
                "a tensor, float/int/bool for a runtime scalar, or mf.Const[int]/[bool]")
        if has_default:
            raise AnnotationError(f"{where}: tensor parameters cannot have defaults")
        a = parse_annotation(text, where)
        self._annotations[p.name] = a
        return TensorParam(p.name, cast(DType, a.dtype), a.dtype_var, (), text)  # None: a variable

    def _resolve_dims(self, params: list[Param]) -> tuple[Param, ...]:
        """The tensor parameters with their dims resolved, each int Const standing in as its
        default (or 1)."""
        dummy = {n: (c.default if c.has_default else 1) for n, c in self._const_names.items()
                 if c.pytype is int}
        out: list[Param] = []
        for p in params:
            if isinstance(p, TensorParam):
                a = self._annotations[p.name]
                p = replace(p, dims=resolve_dims(a.dims, dummy, a.text, self._pwhere(p.name),
                                                 p.name))
            out.append(p)
        return tuple(self._literal_params(out))

    def _literal_params(self, params: list[Param]) -> list[Param]:
        """The tensor parameters with each named literal dim ("K=4") fixed in every annotation
        that names it (see `annotations.unify_literals`)."""
        sizes = unify_literals([(p.name, p.dims) for p in params if isinstance(p, TensorParam)],
                               self._pwhere)
        return [replace(p, dims=with_literals(p.dims, sizes)) if isinstance(p, TensorParam)
                and sizes else p for p in params]

    def _check_batch_names(self, params: tuple[Param, ...]) -> None:
        """A name is either a batch of leading dims ('*B') or a single dim, not both."""
        batch_names: dict[str, str] = {}
        plain_names: dict[str, str] = {}
        for p in params:
            if isinstance(p, TensorParam):
                for d in p.dims:
                    for nm in ([d.base] if d.derived else [d.name]):
                        (batch_names if d.batch else plain_names).setdefault(str(nm), p.name)
        for nm, pn in batch_names.items():
            if nm in plain_names:
                raise AnnotationError(
                    f"{self._pwhere(pn)}: '*{nm}' is a batch of leading dims here but "
                    f"'{nm}' is a single dim in parameter '{plain_names[nm]}'; use another "
                    "name for one of them")

    def _declare_call(self) -> None:
        """The way calls enter the runtime (`runtime.CallPath`): each parameter's kind, for
        the warm-call key."""
        self._calls = runtime.CallPath(self.signature, tuple(
            "tensor" if isinstance(q, TensorParam) else "scalar" if isinstance(q, ScalarParam)
            else "const" for q in self.params), self.backend, self.launch, self.inplace)

    def _declare_return(self) -> Optional[tuple[Annotation, ...]]:
        ann = self.signature.return_annotation
        if ann is inspect.Signature.empty or ann is None:
            return None
        where = self._pwhere("return").replace("parameter 'return'", "return annotation")
        if isinstance(ann, str):
            try:
                value = ast.literal_eval(ann) if ann.lstrip().startswith(("(", "[", "'", '"')) \
                    else ann
            except (ValueError, SyntaxError):
                value = ann
            ann = value
        items = ann if isinstance(ann, (tuple, list)) else (ann,)
        if not all(isinstance(i, str) for i in items):
            raise AnnotationError(f"{where}: expected a string like \"T[R, D]\" or a tuple of "
                                  f"them, got {ann!r}")
        return tuple(parse_annotation(i.strip(), where) for i in items)

    @staticmethod
    def _check_scalar(pytype: type, v: Any, where: str) -> Any:
        ok = (isinstance(v, bool) if pytype is bool else
              isinstance(v, int) and not isinstance(v, bool) if pytype is int else
              isinstance(v, (int, float)) and not isinstance(v, bool))
        if not ok:
            raise BindingError(f"{where}: expected a Python {pytype.__name__}, got "
                               f"{type(v).__name__} {v!r}")
        return (check_int64(v, where) if pytype is int else
                check_float(v, where) if pytype is float else v)

    @staticmethod
    def _check_const(pytype: type, v: Any, where: str) -> Any:
        ok = isinstance(v, bool) if pytype is bool else \
            isinstance(v, int) and not isinstance(v, bool)
        if not ok:
            raise BindingError(f"{where}: mf.Const[{pytype.__name__}] needs a Python "
                               f"{pytype.__name__}, got {type(v).__name__} {v!r}")
        return v if pytype is bool else check_int64(v, where)

    # -- binding ------------------------------------------------------------------------
    def _bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, partial: bool = False,
              dtype_hints: Optional[Mapping[str, Any]] = None
              ) -> tuple[Key, dict[str, Any], dict[str, DType], dict[str, Any]]:
        """-> (specialisation key, values for the runtime, dtype_vars, consts)."""
        try:
            ba = (self.signature.bind_partial if partial else self.signature.bind)(
                *args, **kwargs)
        except TypeError as e:
            raise BindingError(f"{self.where}: {e}; the signature is "
                               f"{self.name}{self.signature}") from None
        ba.apply_defaults()
        got = ba.arguments
        dvars: dict[str, DType] = {}
        dvar_from: dict[str, str] = {}
        for var, v in (dtype_hints or {}).items():
            dvars[var] = self._hint_dtype(var, v)
            dvar_from[var] = f"the binding {var}={v!r}"
        values: dict[str, Any] = {}
        consts: dict[str, Any] = {}
        kinds: dict[bool, str] = {}     # MLX array or torch tensor → first argument of the kind
        for p in self.params:
            where = f"{self.where}, argument '{p.name}'"
            if p.name not in got:
                if isinstance(p, ConstParam):
                    raise BindingError(f"{where}: mf.Const parameter needs a value "
                                       f"({p.name}=...)")
                continue
            v = got[p.name]
            if isinstance(p, TensorParam):
                kinds.setdefault(runtime.is_array(v), p.name)
                self._bind_dtype(p, v, where, dvars, dvar_from)
                values[p.name] = v
            elif isinstance(p, ScalarParam):
                values[p.name] = self._check_scalar(p.pytype, v, where)
            else:
                consts[p.name] = self._check_const(p.pytype, v, where)
        if len(kinds) > 1:
            raise BindingError(f"{self.where}: argument '{kinds[False]}' is a torch.Tensor but "
                               f"'{kinds[True]}' is an mlx.core.array; one call takes one kind "
                               "(torch tensors run on 'mps'/'sim', MLX arrays on 'mlx'): "
                               "convert one of them")
        for var in self.dtype_vars:
            if var not in dvars:
                if not partial:
                    raise BindingError(f"{self.where}: dtype variable {var} is not bound")
                dvars[var] = F32        # introspection without tensors: f32 unless told
        key = (tuple((v, dvars[v].name) for v in self.dtype_vars),
               tuple((n, consts[n]) for n in self._const_names))
        return key, values, dvars, consts

    @staticmethod
    def _bind_dtype(p: TensorParam, v: Any, where: str, dvars: dict[str, DType],
                    dvar_from: dict[str, str]) -> None:
        """Check tensor argument `v` (torch or MLX) against `p`'s dtype, binding its dtype
        variable on first sight (`dvar_from` says where each variable was bound)."""
        is_mlx = runtime.is_array(v)                   # an mlx.core.array: MLX backend
        if not isinstance(v, torch.Tensor) and not is_mlx:
            raise BindingError(f"{where}: expected a torch.Tensor (annotated "
                               f"\"{p.annotation}\"), got {type(v).__name__}")
        if not is_mlx:
            runtime.check_dense(where, p.name, v)
        try:
            dt = runtime.array_dtype(v) if is_mlx else dtypes.from_torch(v.dtype)
        except TypeError as e:
            raise BindingError(f"{where}: {e}") from None
        if p.dtype_var is None:
            if dt is not p.dtype:
                raise BindingError(f"{where}: annotated \"{p.annotation}\" needs "
                                   f"{p.dtype.torch}, got {v.dtype}")
        elif p.dtype_var in dvars:
            if dvars[p.dtype_var] is not dt:
                raise BindingError(
                    f"{where}: dtype variable {p.dtype_var} is {dvars[p.dtype_var]} "
                    f"from {dvar_from[p.dtype_var]} but argument '{p.name}' is "
                    f"{dt} ({v.dtype}); tensors sharing {p.dtype_var} must have one "
                    "dtype")
        else:
            dvars[p.dtype_var] = dt
            dvar_from[p.dtype_var] = f"argument '{p.name}'"

    def _hint_dtype(self, var: str, v: Any) -> DType:
        if isinstance(v, DType):
            return v
        if isinstance(v, torch.dtype):
            return dtypes.from_torch(v)
        if isinstance(v, str) and v in dtypes.ALL:
            return dtypes.ALL[v]
        raise BindingError(f"{self.where}: dtype variable {var}={v!r} is not a dtype (use one "
                           f"of {' '.join(dtypes.ALL)} or a torch dtype)")

    def _split_bindings(self, kwargs: Mapping[str, Any]
                        ) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
        """kwargs of source()/ir()/graph(): parameters, dtype variables and dim sizes."""
        params, hints, sizes = {}, {}, {}
        for k, v in kwargs.items():
            if k in self.signature.parameters:
                params[k] = v
            elif k in self.dtype_vars:
                hints[k] = v
            elif k in self.dims:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise BindingError(f"{self.where}: dim size {k}={v!r} must be a "
                                       "non-negative int")
                sizes[k] = v
            else:
                raise BindingError(
                    f"{self.where}: unknown binding {k}={v!r}; expected a parameter "
                    f"({', '.join(self.signature.parameters)}), a dtype variable "
                    f"({', '.join(self.dtype_vars) or 'none'}) or a dim "
                    f"({', '.join(self.dims) or 'none'})")
        return params, hints, sizes

    # -- specialisation -----------------------------------------------------------------
    def _graph(self, key: Key, dvars: Mapping[str, DType], consts: Mapping[str, Any]) -> Graph:
        return self._graphs.get_or_build(key, lambda: self._trace(dict(dvars), dict(consts)))

    def _trace(self, dvars: dict[str, DType], consts: dict[str, Any]) -> Graph:
        params: list[Param] = []
        axis_specs: dict[str, AxisSpec] = {}
        for p in self.params:
            if isinstance(p, TensorParam):
                a = self._annotations[p.name]
                dims = resolve_dims(a.dims, consts, a.text, self._pwhere(p.name), p.name)
                p = replace(p, dtype=p.dtype or dvars[str(p.dtype_var)], dims=dims)
            params.append(p)
        params = self._literal_params(params)
        for p in params:
            for d in p.dims if isinstance(p, TensorParam) else ():
                axis_specs.setdefault(d.name, d)
        trace = Trace(self.name, self.loc, axis_specs, dvars,
                      {p.name: p.axes for p in params if isinstance(p, TensorParam)})
        call_args, call_kwargs = [], {}
        for p, sp in zip(params, self.signature.parameters.values()):
            if isinstance(p, TensorParam):
                axes = tuple(sorted(p.axes, key=trace.order.__getitem__))
                v = Sym(Node(Op.LOAD, (), p.dtype, axes, attr=p.name, loc=self.loc), trace)
            elif isinstance(p, ScalarParam):
                v = Sym(Node(Op.SCALAR, (), p.dtype, (), attr=p.name, weak=True, loc=self.loc),
                        trace)
            else:
                v = consts[p.name]
            if sp.kind == sp.KEYWORD_ONLY:
                call_kwargs[p.name] = v
            else:
                call_args.append(v)
        with trace:
            result = self.fn(*call_args, **call_kwargs)
        outputs = self._outputs(result, trace, params, consts, dvars)
        return Graph(self.name, tuple(params), outputs, consts=dict(consts),
                     dtype_vars=dict(dvars), loc=self.loc)

    def _outputs(self, result: Any, trace: Trace, params: list[Param], consts: dict[str, Any],
                 dvars: dict[str, DType]) -> tuple[Output, ...]:
        ret_loc = (self.loc[0], self._lines.get("return", self.loc[1]))
        if result is None:
            raise trace.error("the kernel returns nothing; return the output value(s)",
                              self.loc)
        items = result if isinstance(result, (tuple, list)) else (result,)
        if not items:
            raise trace.error("the kernel returns an empty tuple", self.loc)
        if self._return is not None and len(self._return) != len(items):
            raise trace.error(f"the return annotation declares {len(self._return)} output(s) "
                              f"but the kernel returns {len(items)}", ret_loc)
        tensors = [p for p in params if isinstance(p, TensorParam)]
        outs = []
        for i, v in enumerate(items):
            what = f"output {i}" if len(items) > 1 else "the output"
            if not isinstance(v, Sym):
                raise trace.error(f"{what} is {type(v).__name__} {v!r}, not a value computed "
                                  "from the kernel's tensor arguments", self.loc)
            n = v.node
            if n.weak:
                raise trace.error(f"{what} depends on no tensor argument (only scalars); an "
                                  "output must be computed from tensors", self.loc)
            if self._return is not None:
                axes = self._declared_axes(self._return[i], n, what, trace, consts, dvars,
                                           ret_loc)
            else:
                axes = self._infer_axes(n, what, tensors, trace)
            outs.append(Output(n, axes, n.dtype))
        return tuple(outs)

    def _declared_axes(self, a: Annotation, n: Node, what: str, trace: Trace,
                       consts: dict[str, Any], dvars: dict[str, DType],
                       loc: tuple[str, int]) -> tuple[str, ...]:
        dt = a.dtype or dvars.get(str(a.dtype_var))
        if a.dtype_var and a.dtype_var not in dvars:
            raise trace.error(f"the return annotation \"{a.text}\" uses dtype variable "
                              f"{a.dtype_var}, which no argument binds", loc)
        if dt is not n.dtype:
            raise trace.error(f"{what} is {n.dtype} but the return annotation \"{a.text}\" "
                              f"says {dt}; convert with .to(...)", loc)
        axes = tuple(d.name for d in resolve_dims(a.dims, consts, a.text,
                                                  f"kernel '{self.name}' return annotation"))
        if set(axes) != set(n.axes) or len(axes) != len(n.axes):
            raise trace.error(f"{what} has axes {list(n.axes)} but the return annotation "
                              f"\"{a.text}\" lists {list(axes)}", loc)
        return axes

    def _infer_axes(self, n: Node, what: str, tensors: list[TensorParam],
                    trace: Trace) -> tuple[str, ...]:
        """The first argument (in declaration order) whose annotation holds all the output's
        axes gives their order; without one the order is ambiguous."""
        if len(n.axes) <= 1:
            return n.axes
        for p in tensors:
            if set(n.axes) <= set(p.axes):
                return tuple(a for a in p.axes if a in n.axes)
        raise trace.error(f"{what} has axes {list(n.axes)}, which no single argument's "
                          "annotation holds, so their order is ambiguous; add a return "
                          f"annotation such as -> \"T[{', '.join(n.axes)}]\"", self.loc)

    # -- public API ---------------------------------------------------------------------
    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The traced Graph for the specialisation these arguments (or bindings) select."""
        params, hints, _ = self._split_bindings(kwargs)
        key, _, dvars, consts = self._bind(args, params, partial=True, dtype_hints=hints)
        return self._graph(key, dvars, consts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        calls = self._calls
        if calls.launch is not self.launch:     # `launch` reassigned: other closures
            calls = self._calls = calls.relaunched(self.launch)
        if not kwargs:                          # a warm call by position: its replay
            out = calls.fast(args)
            if out is not MISS:
                return out
        return calls(self._bound, args, kwargs)

    def _bound(self, args: tuple[Any, ...],
               kwargs: Mapping[str, Any]) -> tuple[Graph, dict[str, Any]]:
        """(the traced graph, values for the runtime) of a call, every argument checked."""
        key, values, dvars, consts = self._bind(args, kwargs)
        return self._graph(key, dvars, consts), values

    def _introspect(self, show: Callable[..., str], args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> str:
        params, hints, sizes = self._split_bindings(kwargs)
        key, values, dvars, consts = self._bind(args, params, partial=True, dtype_hints=hints)
        g = self._graph(key, dvars, consts)
        return show(g, values, sizes=sizes or None, launch=self.launch)

    def launches(self, *args: Any, **kwargs: Any) -> tuple[tuple[str, int, int], ...]:
        """What calling the kernel with these arguments would launch, without running it: one
        (host name, threads, threadgroup size) per kernel launch, in order (a row reduction's
        variant for this row length, attention's decode and merge kernels when its keys are
        split; () when the outputs are empty). Every check of a call is made, and the library
        is compiled (the pipeline's thread limit decides some variants).

            >>> rms_norm.launches(torch.randn(8, 4096), torch.randn(4096))
            (('rms_norm_f32_group', 4096, 512),)
        """
        return runtime.launches(*self._bound(args, kwargs), self.backend, self.launch)

    def source(self, *args: Any, **bindings: Any) -> str:
        """The MSL of the specialisation that these example arguments select. Without tensors,
        bindings give dtype variables (T="f16", default f32), Consts and dim sizes (D=4096)."""
        return self._introspect(runtime.source, args, bindings)

    def ir(self, *args: Any, **bindings: Any) -> str:
        """A readable dump of the lowered kernel IR (same arguments as `source`)."""
        return self._introspect(runtime.ir, args, bindings)

    def as_op(self, name: str) -> Any:
        """Register this kernel as the PyTorch operator `name` ("mylib::rms_norm"), usable
        under torch.compile / torch.export and differentiable; returns the operator (call it
        like the kernel; `.op` is the torch.library op). See metalforge.torch_ops."""
        return register(self, name)

    def backward_source(self, *args: Any, **bindings: Any) -> str:
        """The MSL of the backward kernels (derived by metalforge.autodiff) of the
        specialisation these arguments select, in launch order; same arguments as `source`."""
        params, hints, sizes = self._split_bindings(bindings)
        key, values, dvars, consts = self._bind(args, params, partial=True, dtype_hints=hints)
        return runtime.backward_source(self._graph(key, dvars, consts), values,
                                       sizes=sizes or None, launch=self.launch)

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate the kernel with torch eager ops (float64 math) on these arguments (MLX
        arrays are evaluated on copies as CPU tensors and the results returned as MLX arrays)."""
        return runtime.reference(*self._bound(args, kwargs))

    def variants(self, compiled: bool = False) -> list[dict[str, Any]]:
        """The specialisations traced so far: dtype variables and Const values of each.
        compiled=True: one entry per library compiled for them, adding its "host_name" (and
        "host_names" of all its kernels), "backend", "family" and the "launches" (launch
        policies) it was built for."""
        if not compiled:
            return [{**dict(dv), **dict(cv)} for dv, cv in list(self._graphs)]
        out = []
        for (dv, cv), g in list(self._graphs.items()):     # other threads may trace meanwhile
            for c in runtime.compiled(g):
                out.append({**dict(dv), **dict(cv), **c})
        return out

    def with_launch(self, launch: Optional[Mapping[str, Any]] = None, /,
                    **options: Any) -> "Kernel":
        """A view of this kernel whose calls use these launch-policy overrides (on top of the
        kernel's own `launch=`): `rms_norm.with_launch(threads_per_group=128)(x, w)`. It shares
        the traces and compiled kernels; options are checked here, before any launch."""
        where = f"{self.where}, with_launch"
        opts = {**check_options(launch or {}, where), **check_options(options, where)}
        view = copy.copy(self)
        view.launch = {**(self.launch or {}), **opts} or None
        return view


def kernel(fn: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None,
           backend: Optional[str] = None,
           launch: Optional[Mapping[str, Any]] = None,
           inplace: Union[None, str, Mapping[int, str]] = None) -> Any:
    """Turn an annotated Python function into a metalforge kernel: `@mf.kernel` or
    `@mf.kernel(name=..., backend="sim"|"mps"|"cuda"|"mlx", launch={...})`.

    fn:      the kernel body; tensor parameters annotated with strings ("T[R, D]"), runtime
             scalars with float/int/bool, compile-time constants with mf.Const[int|bool].
    name:    the kernel's name in generated MSL (default: the function's name).
    backend: force a backend instead of following the tensors' device.
    launch:  launch-policy overrides ({"threads_per_group": 128, ...}).
    inplace: outputs written into arguments instead of fresh tensors: "cache" (the one output
             is written into argument `cache`, which the call returns) or {output index:
             argument name}. Any call may also pass `out=t` (`out=(t0, t1)`).

    Example::

        @mf.kernel
        def silu(x: "T[*B, D]"):
            return x * mf.sigmoid(x)
    """
    if fn is None:
        return lambda f: Kernel(f, name=name, backend=backend, launch=launch, inplace=inplace)
    if not callable(fn):
        raise TraceError(f"@mf.kernel decorates a function, got {fn!r}")
    return Kernel(fn, name=name, backend=backend, launch=launch, inplace=inplace)
