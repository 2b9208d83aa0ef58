"""metalforge kernels as PyTorch operators and as differentiable functions.

`kernel.as_op("mylib::rms_norm")` registers the kernel as a `torch.library.custom_op`:

- schema from the annotations, one argument per kernel parameter in declaration order: tensors
  are ``Tensor``, runtime scalars ``float``/``int``/``bool`` (with their defaults), `mf.Const`
  values ``int``/``bool``; one ``Tensor`` per output;
- a fake (meta) implementation derived from the graph: output shapes from the named dims of the
  inputs (``*B`` leading dims and derived dims included, symbolic sizes kept symbolic), dtypes
  from promotion, the inputs' device; so `torch.compile(fullgraph=True)` traces through the op
  without a graph break and `torch.export` records it;
- autograd: the backward is a second operator (``mylib::rms_norm_backward``) that runs the
  kernels `metalforge.autodiff` derives from the graph. Called with an argument that requires
  grad, the wrapper runs ``mylib::rms_norm_saving`` instead of the op (``(..., int[] wrt) ->
  (Tensor..., Tensor[] saved)``): the forward the direct call runs, which also hands the
  backward what it would recompute (attention's rows' logsumexp; cross-entropy's or a
  softmax's where saving moves fewer bytes: `metalforge.op_saving`); ``torch.ops.mylib.rms_norm``
  called directly saves its inputs only. Eagerly on plain tensors (`plain_eager`: nothing
  traces the call) the wrapper runs the kernel's direct differentiable call instead, the same
  kernels and saved tensors without the custom ops' host layers; `op.dispatched(...)` always
  goes through the operators;
- mutation: an output the kernel declares written into an argument (`@mf.kernel(inplace=...)`)
  marks that argument ``Tensor(a!)`` and is not returned by the op (the op's Python wrapper
  returns the argument in its place, like the kernel); ``op(..., out=t)`` calls the out variant
  ``mylib::rms_norm_out`` (``(..., Tensor(a!) out) -> ()``), so torch.compile's
  functionalization sees every write. Neither is differentiable: refused when grad is needed.

Calling a kernel directly on tensors that require grad goes through
`runtime.autograd.call_differentiable` (a `torch.autograd.Function` over the same backward
kernels). A kernel that has no derivative
(integer outputs, `mf.prod`) raises `NotDifferentiable` when it is called, not at backward.
"""
from __future__ import annotations

import math
import re
import threading
from typing import Any, Mapping, Optional, Sequence

import torch

from . import autodiff, op_saving
from .autodiff import NotDifferentiable
from .errors import BindingError
from .graph import ConstParam, Graph, TensorParam
from .runtime.autograd import call_differentiable
from .shapes import bind_shapes, lay_out, output_shape

__all__ = ["KernelOp", "register", "NotDifferentiable", "OpError"]

_NAME = re.compile(r"^([A-Za-z_]\w*)::([A-Za-z_]\w*)$")


class OpError(ValueError):
    """A kernel cannot be registered as an operator under this name or schema."""


# --------------------------------------------------------------------------- schema

def _default(v: Any) -> str:
    return repr(v) if not isinstance(v, float) else repr(float(v))


def schema_args(kernel, with_defaults: bool = True, mutated: Sequence[str] = ()) -> list[str]:
    """The schema's argument list: one entry per kernel parameter; a tensor in `mutated` (an
    argument a declared in-place output is written into) is marked ``Tensor(a!)``."""
    out = []
    for p in kernel.params:
        if isinstance(p, TensorParam):
            mark = f"({alias_letter(mutated.index(p.name))}!)" if p.name in mutated else ""
            out.append(f"Tensor{mark} {p.name}")
            continue
        ty = {float: "float", int: "int", bool: "bool"}[p.pytype]
        text = f"{ty} {p.name}"
        if with_defaults and p.has_default:
            text += f"={_default(p.default)}"
        out.append(text)
    return out


def alias_letter(i: int) -> str:
    """The alias set of the i-th mutated argument of a schema: a, b, ... z, a1, b1, ..."""
    return "abcdefghijklmnopqrstuvwxyz"[i % 26] + (str(i // 26) if i >= 26 else "")


def _check_schema_names(kernel) -> None:
    for p in kernel.params:
        if p.name in ("self", "out") or p.name.startswith("__"):
            raise OpError(f"{kernel.where}: parameter '{p.name}' cannot be an argument name of "
                          "a PyTorch operator schema; rename it")


# --------------------------------------------------------------------------- shapes

def fake_outputs(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """Empty outputs of the right shape, dtype and device for these (possibly fake) inputs.
    Concrete shapes are checked like a real call; symbolic sizes stay symbolic."""
    dev = next(iter(tensors.values())).device if tensors else torch.device("cpu")
    if all(isinstance(s, int) for t in tensors.values() for s in t.shape):
        b = bind_shapes(graph, tensors)
        return [torch.empty(output_shape(b, o), dtype=o.dtype.torch, device=dev)
                for o in graph.outputs]
    sizes: dict[str, Any] = {}
    batch: dict[str, tuple] = {}
    grouped: list[tuple[tuple[str, ...], Any]] = []
    for p in graph.tensors:
        shape = tuple(tensors[p.name].shape)
        dims = p.storage
        if dims and dims[0][0].batch:
            lead = len(shape) - (len(dims) - 1)
            batch.setdefault(dims[0][0].name, shape[:lead])
            dims, shape = dims[1:], shape[lead:]
        for axes, s in zip(dims, shape):
            if len(axes) > 1:
                grouped.append((tuple(a.name for a in axes), s))
                continue
            d = axes[0]
            sizes.setdefault(d.name, s)
            if d.derived and d.base not in sizes and d.mul == 1 and d.add == 0:
                sizes[d.base] = s * d.div
    for names, s in grouped:                # "(G R)": R is the size over the others
        known = [sizes[n] for n in names if n in sizes]
        for n in names:
            sizes.setdefault(n, s // math.prod(known))
    groups = tuple(dict.fromkeys(g for g, _ in grouped))

    def size(a: str) -> Any:
        if a not in sizes:
            d = graph.axis_spec(a)
            sizes[a] = (sizes[d.base] * d.mul) // d.div + d.add
        return sizes[a]
    return [torch.empty(lay_out(o.axes, groups, batch, size), dtype=o.dtype.torch, device=dev)
            for o in graph.outputs]


# --------------------------------------------------------------------------- the operator

class KernelOp:
    """A kernel registered as a PyTorch operator. Call it like the kernel (keywords and
    defaults work); `.op` is the `torch.library.CustomOpDef` (also `torch.ops.<ns>.<name>`),
    `.backward_op` the operator its autograd calls."""

    def __init__(self, kernel, name: str):
        self.kernel = kernel
        self.name = name
        self.names = tuple(p.name for p in kernel.params)
        self._tensor_pos = [i for i, p in enumerate(kernel.params)
                            if isinstance(p, TensorParam)]
        self._float_pos = [i for i in self._tensor_pos
                           if kernel.params[i].dtype is None or kernel.params[i].dtype.is_float]
        _check_schema_names(kernel)
        self.inplace = dict(kernel.inplace)         # output index -> the argument it writes
        self.mutated = tuple(n for _, n in kernel.inplace)
        self.count = self._count()
        self.fresh = [i for i in range(self.count) if i not in self.inplace]   # op returns
        self.schema = (f"({', '.join(schema_args(kernel, mutated=self.mutated))}) -> "
                       f"{_returns(len(self.fresh))}")
        try:
            self.op = torch.library.custom_op(name, self._impl, mutates_args=self.mutated,
                                              schema=self.schema)
            self.op.register_fake(self._fake)
            self.out_op = self._define_out() if self.fresh else None
            bargs = schema_args(kernel, with_defaults=False)
            self.backward_schema = (f"({', '.join(bargs + _BACKWARD_ARGS)}) -> Tensor[]")
            self.backward_op = torch.library.custom_op(f"{name}_backward", self._backward_impl,
                                                       mutates_args=(),
                                                       schema=self.backward_schema)
            self.saving_op = None if self.mutated else self._define_saving(bargs)
        except (RuntimeError, ValueError) as e:
            raise OpError(f"{kernel.where}: as_op({name!r}): PyTorch refused the operator "
                          f"schema {self.schema}: {e}") from None
        self.backward_op.register_fake(self._backward_fake)
        if self.saving_op is not None:    # an op writing into an argument is not differentiable
            self.op.register_autograd(self._backward, setup_context=self._setup_context)
            self.saving_op.register_fake(self._saving_fake)
            self.saving_op.register_autograd(self._saving_backward,
                                             setup_context=self._saving_setup)

    def _define_saving(self, args: list[str]) -> Any:
        """`<name>_saving`: the op's forward for a call that needs gradients, returning the op's
        outputs and what the backward reads (`op_saving`)."""
        self.saving_schema = (f"({', '.join(args + ['int[] wrt'])}) -> "
                              f"({', '.join(['Tensor'] * len(self.fresh) + ['Tensor[]'])})")
        return torch.library.custom_op(f"{self.name}_saving", self._saving_impl,
                                       mutates_args=(), schema=self.saving_schema)

    def _define_out(self) -> Any:
        """`<name>_out`: the op with out= tensors last, ``(..., Tensor(a!) out) -> ()``
        (custom ops take no keyword-only tensors; no defaults, which cannot precede `out`:
        the wrapper passes every argument)."""
        clash = [n for n in self.out_names if n in self.names]
        if clash:
            raise OpError(f"{self.kernel.where}: as_op({self.name!r}): parameter "
                          f"'{clash[0]}' is the name of an out= argument of the operator's "
                          "out variant; rename it")
        outs = [f"Tensor({alias_letter(len(self.mutated) + k)}!) {n}"
                for k, n in enumerate(self.out_names)]
        args = schema_args(self.kernel, with_defaults=False, mutated=self.mutated)
        self.out_schema = (f"({', '.join(args)}, "
                           f"{', '.join(outs)}) -> ()")
        op = torch.library.custom_op(f"{self.name}_out", self._out_impl,
                                     mutates_args=self.mutated + tuple(self.out_names),
                                     schema=self.out_schema)
        op.register_fake(lambda *args: None)
        return op

    @property
    def out_names(self) -> list[str]:
        return ["out"] if len(self.fresh) == 1 else [f"out{i}" for i in self.fresh]

    def __repr__(self) -> str:
        return f"<metalforge op {self.name}{self.schema}>"

    def _count(self) -> int:
        """The outputs, counted on one trace (dtype variables f32, Consts at their defaults or
        0/False): the number of outputs must not depend on a Const's value."""
        stand_in = {p.name: p.default if p.has_default else p.pytype()
                    for p in self.kernel.params if isinstance(p, ConstParam)}
        try:
            return len(self.kernel.graph(**stand_in).outputs)
        except (TypeError, ValueError) as e:        # trace, binding and annotation errors
            raise OpError(f"{self.kernel.where}: as_op({self.name!r}): could not trace the "
                          f"kernel to count its outputs ({e}); give its mf.Const parameters "
                          "defaults") from None

    # -- argument handling -------------------------------------------------------------
    def args_of(self, args: tuple, kwargs: Mapping[str, Any]) -> tuple:
        """The op's positional arguments for a kernel-style call."""
        try:
            ba = self.kernel.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise BindingError(f"{self.kernel.where}: {e}; the signature is "
                               f"{self.kernel.name}{self.kernel.signature}") from None
        ba.apply_defaults()
        return tuple(ba.arguments[n] for n in self.names)

    def __call__(self, *args, out: Any = None, **kwargs):
        return self._call(args, kwargs, out, eager_direct=True)

    def dispatched(self, *args, out: Any = None, **kwargs):
        """The call through the registered operators whatever the context: a call that needs
        gradients runs ``<name>_saving`` and ``<name>_backward`` even eagerly on plain tensors
        (where `__call__` runs the kernel's direct differentiable call: `plain_eager`)."""
        return self._call(args, kwargs, out, eager_direct=False)

    def _call(self, args: tuple, kwargs: Mapping[str, Any], out: Any, eager_direct: bool):
        a = self.args_of(args, kwargs)
        if out is None and not self.mutated:
            wrt = self._grad_wrt(a)
            direct = eager_direct and plain_eager(a)    # nothing traces: the kernel's own call
            if not wrt:
                return self._impl(*a) if direct else self.op(*a)
            if direct:                              # the direct call's autograd
                return call_differentiable(self._graph(a), self._values(a), *self._how(),
                                           op=f"{self.name}_backward")
            got = self.saving_op(*a, wrt)       # the forward that saves for the backward
            return got[0] if len(got) == 2 else tuple(got[:-1])
        self._refuse_grad(a, out)
        if out is None:
            got = self.op(*a)
            fresh = list(got) if isinstance(got, tuple) else [] if got is None else [got]
        else:
            fresh = self._out_tensors(out)
            self.out_op(*a, *fresh)
        full: list[Any] = [None] * self.count
        for i, t in zip(self.fresh, fresh):
            full[i] = t
        for i, n in self.inplace.items():
            full[i] = a[self.names.index(n)]
        return full[0] if self.count == 1 else tuple(full)

    def _out_tensors(self, out: Any) -> list[torch.Tensor]:
        """The out= tensors of the outputs the op returns (kernel-style: one tensor, or one
        entry per output with None at the declared in-place ones)."""
        items = (out,) if isinstance(out, torch.Tensor) else tuple(out) \
            if isinstance(out, (tuple, list)) else None
        if items is not None and len(items) == self.count and len(self.fresh) != self.count:
            items = tuple(items[i] for i in self.fresh)
        if items is None or len(items) != len(self.fresh) or \
                not all(isinstance(t, torch.Tensor) for t in items):
            raise BindingError(f"{self.kernel.where}: {self.name}(..., out=...) takes one "
                               f"tensor per output the op returns ({len(self.fresh)}: outputs "
                               f"{self.fresh}), got {out!r:.80}")
        return list(items)

    def _grad_wrt(self, args: Sequence[Any]) -> list[int]:
        """The float arguments that require grad, where grad mode is on (torch.export, which
        records a forward graph, records the op itself: nothing to save for)."""
        if not torch.is_grad_enabled() or torch.compiler.is_exporting():
            return []
        return [i for i in self._float_pos if isinstance(args[i], torch.Tensor)
                and args[i].requires_grad and args[i].dtype.is_floating_point]

    def _refuse_grad(self, args: Sequence[Any], out: Any) -> None:
        if not torch.is_grad_enabled():
            return
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*args, *outs)):
            raise BindingError(f"{self.kernel.where}: {self.name} with out= (or an in-place "
                               "output) does not support automatic differentiation, but an "
                               "argument requires grad; call it under torch.no_grad() if no "
                               "gradient is needed")

    def _graph(self, args: Sequence[Any]) -> Graph:
        return self.kernel.graph(**dict(zip(self.names, args)))

    def _values(self, args: Sequence[Any]) -> dict[str, Any]:
        return {p.name: a for p, a in zip(self.kernel.params, args)
                if not isinstance(p, ConstParam)}

    # -- forward -----------------------------------------------------------------------
    def _impl(self, *args):
        with torch.no_grad():
            out = self.kernel(**dict(zip(self.names, args)))
        # an op output must not alias an input (an identity kernel returns its input); the
        # outputs written into arguments are not returned
        outs = out if isinstance(out, tuple) else (out,)
        ins = [args[i] for i in self._tensor_pos]
        outs = tuple(o.clone() if any(o is t for t in ins) else o
                     for i, o in enumerate(outs) if i in self.fresh)
        return None if not outs else outs if len(outs) > 1 else outs[0]

    def _out_impl(self, *args):
        n = len(self.names)
        full: list[Optional[torch.Tensor]] = [None] * self.count
        for i, t in zip(self.fresh, args[n:]):
            full[i] = t
        with torch.no_grad():
            self.kernel(**dict(zip(self.names, args[:n])), out=tuple(full))

    def _fake(self, *args):
        g = self._graph(args)
        outs = fake_outputs(g, {t.name: args[i] for i, t in zip(self._tensor_pos, g.tensors)})
        outs = [o for i, o in enumerate(outs) if i in self.fresh]
        return None if not outs else tuple(outs) if len(outs) > 1 else outs[0]

    def _tensors(self, g: Graph, args: Sequence[Any]) -> dict[str, Any]:
        return {t.name: args[i] for i, t in zip(self._tensor_pos, g.tensors)}

    def _how(self) -> tuple:
        return self.kernel.backend, self.kernel.launch

    # -- the forward that saves (`op_saving`) -----------------------------------------------
    def _saving_impl(self, *args):
        fwd, wrt = args[:-1], tuple(self.names[i] for i in args[-1])
        g = self._graph(fwd)
        with torch.no_grad():
            s, out, saved = op_saving.forward(g, self._values(fwd), self._how(), wrt)
        if saved is None:           # recomputed: buffers of the right shapes, never read
            saved = fake_outputs(s.graph, self._tensors(g, fwd))[len(g.outputs):]
        outs = out if isinstance(out, tuple) else (out,)
        ins = [fwd[i] for i in self._tensor_pos]
        outs = tuple(o.clone() if any(o is t for t in ins) else o for o in outs)
        return (*outs, list(saved))

    def _saving_fake(self, *args):
        fwd, wrt = args[:-1], tuple(self.names[i] for i in args[-1])
        g = self._graph(fwd)
        s = op_saving.saves(g, wrt)
        full = fake_outputs(s.graph, self._tensors(g, fwd))
        return (*full[:len(g.outputs)], full[len(g.outputs):])

    def _saving_setup(self, ctx, inputs, output) -> None:
        fwd, wrt = inputs[:-1], inputs[-1]
        outs, saved = output[:-1], list(output[-1])
        ctx.mark_non_differentiable(*saved)
        ctx.set_materialize_grads(False)    # no zeros filled for `saved`, which has no gradient
        kind = op_saving.saves(self._graph(fwd), tuple(self.names[i] for i in wrt)).kind
        kept = list(outs) if kind == "forward" else []      # attention's O: its backward reads it
        ctx.save_for_backward(*[fwd[i] for i in self._tensor_pos], *kept, *saved)
        ctx.others = [None if i in self._tensor_pos else a for i, a in enumerate(fwd)]
        ctx.outs = [(o.shape, o.dtype, o.device) for o in outs]
        ctx.saved_for = list(wrt)

    def _saving_backward(self, ctx, *grads):
        n = len(self._tensor_pos)
        got = self._backward_from(ctx, grads[:-1], ctx.saved_tensors[:n], ctx.saved_for,
                                  list(ctx.saved_tensors[n:]))
        return (*got, None)

    # -- autograd ----------------------------------------------------------------------
    def _wrt(self, args: Sequence[Any], flags: Sequence[bool]) -> list[int]:
        return [i for i in self._float_pos if flags[i] and isinstance(args[i], torch.Tensor)
                and args[i].dtype.is_floating_point]

    def _setup_context(self, ctx, inputs, output) -> None:
        wrt = self._wrt(inputs, [isinstance(a, torch.Tensor) and a.requires_grad
                                 for a in inputs])
        if wrt:         # a kernel with no derivative fails here, at the call
            autodiff.backward_of(self._graph(inputs), tuple(self.names[i] for i in wrt))
        ctx.save_for_backward(*[inputs[i] for i in self._tensor_pos])
        ctx.others = [None if i in self._tensor_pos else a for i, a in enumerate(inputs)]
        outs = output if isinstance(output, tuple) else (output,)
        ctx.outs = [(o.shape, o.dtype, o.device) for o in outs]

    def _backward(self, ctx, *grads):
        return self._backward_from(ctx, grads, ctx.saved_tensors, [], [])

    def _backward_from(self, ctx, grads: Sequence[Any], tensors: Sequence[torch.Tensor],
                       saved_for: list[int], saved: list[torch.Tensor]) -> tuple:
        """The gradients of the op's arguments (None where not asked) through the backward op,
        given the output gradients and what the forward saved."""
        args = list(ctx.others)
        for i, t in zip(self._tensor_pos, tensors):
            args[i] = t
        wrt = self._wrt(args, ctx.needs_input_grad)
        if not wrt:
            return tuple(None for _ in args)
        dys = [g if g is not None else torch.zeros(shape, dtype=dt, device=dev)
               for g, (shape, dt, dev) in zip(grads, ctx.outs) if dt.is_floating_point]
        got = self.backward_op(*args, dys, wrt, saved_for, saved)
        out: list = [None] * len(args)
        for i, g in zip(wrt, got):
            out[i] = g
        return tuple(out)

    def _split_backward_args(self, args):
        n = len(self.names)
        return list(args[:n]), list(args[n]), list(args[n + 1])

    def _backward_impl(self, *args):
        fwd, dys, wrt = self._split_backward_args(args)
        saved_for, saved = args[-2], tuple(args[-1])
        g = self._graph(fwd)
        floats = iter(dys)
        full = [next(floats) if o.dtype.is_float else None for o in g.outputs]
        names = tuple(self.names[i] for i in wrt)
        with torch.no_grad():
            grads = op_saving.backward(g, self._values(fwd), self._how(), names,
                                       tuple(self.names[i] for i in saved_for), saved, full)
        return [grads[self.names[i]].contiguous() for i in wrt]     # as _backward_fake says

    def _backward_fake(self, *args):
        """Contiguous gradients, as the kernels write them: not `empty_like` of a permuted
        input (its strides), which let torch.compile trace a `.view` of the gradient that the
        real, contiguous one cannot take (an input that is a transposed view: attention's
        heads)."""
        fwd, _, wrt = self._split_backward_args(args)
        return [torch.empty_like(fwd[i], memory_format=torch.contiguous_format) for i in wrt]


def plain_eager(args: Sequence[Any]) -> bool:
    """Whether a call on `args` runs eagerly on plain tensors: nothing traces it (torch.compile,
    torch.export, make_fx, fake tensors), no dispatch or torch-function mode is active and no
    argument is a tensor subclass or a functorch (vmap, grad) wrapper. There the operator's
    dispatcher layers (the custom op's autograd and dispatch wrappers, twice a step) are host
    time only, so the call runs the kernel directly (the op's implementation, `_impl`) and one
    that needs gradients the kernel's direct differentiable call: the same forward, saved
    tensors and backward kernels (`runtime.autograd`)."""
    if torch.compiler.is_compiling():   # first: dynamo folds it, the rest is never traced
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    return all(type(t) in (torch.Tensor, torch.nn.Parameter)
               and not torch._C._functorch.is_functorch_wrapped_tensor(t)
               for t in args if isinstance(t, torch.Tensor))


# the backward op's arguments after the op's: output gradients, the arguments whose gradients
# are asked, those the forward saved for (empty: the op itself ran, nothing saved), what it saved
_BACKWARD_ARGS = ['Tensor[] grads', 'int[] wrt', 'int[] saved_for', 'Tensor[] saved']


def _returns(n: int) -> str:
    return "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"


_registered: dict[str, KernelOp] = {}       # operator name -> its KernelOp (explicit cache)
_register_lock = threading.Lock()           # one registration at a time (check, then define)


def _definition(kernel) -> tuple:
    return kernel.fn.__code__.co_filename, kernel.fn.__qualname__, kernel.name


def register(kernel, name: str) -> KernelOp:
    """`kernel.as_op(name)`: register (once, whichever threads ask) and return the operator."""
    m = _NAME.match(name) if isinstance(name, str) else None
    if m is None:
        raise OpError(f"{kernel.where}: as_op({name!r}): an operator name is "
                      "'namespace::name', e.g. 'mylib::rms_norm' (identifiers only)")
    with _register_lock:
        done = _registered.get(name)
        if done is not None:
            if _definition(done.kernel) == _definition(kernel):
                done.kernel = kernel        # the same definition executed again (module re-run)
                return done
            raise OpError(f"{kernel.where}: as_op({name!r}): that name is already registered "
                          f"for {done.kernel.where}; choose another name")
        _check_free(kernel, name)
        op = _registered[name] = KernelOp(kernel, name)
    return op


def _check_free(kernel, name: str) -> None:
    """Refuse a name PyTorch already has an operator for (or its backward's name)."""
    for n in (name, f"{name}_backward", f"{name}_out", f"{name}_saving"):
        ns, op = n.split("::")
        try:
            getattr(getattr(torch.ops, ns), op)
        except (AttributeError, RuntimeError):
            continue
        raise OpError(f"{kernel.where}: as_op({name!r}): PyTorch already has an operator "
                      f"'{n}'; choose another name")
