"""Tensor arguments metalforge can bind: dense, strided ones. A sparse (COO, CSR, CSC, BSR,
BSC), MKL-DNN or nested tensor has no strided storage a kernel could read; it is refused with a
`BindingError` that names the argument and the conversion, before anything is traced or
launched (torch's own error, from deep inside the binding, named neither)."""
from __future__ import annotations

import torch

from ..errors import BindingError

_KINDS = {torch.sparse_coo: "a sparse COO", torch.sparse_csr: "a sparse CSR",
          torch.sparse_csc: "a sparse CSC", torch.sparse_bsr: "a sparse BSR",
          torch.sparse_bsc: "a sparse BSC",
          torch._mkldnn: "an MKL-DNN"}  # type: ignore[attr-defined]


def check_dense(where: str, name: str, t: torch.Tensor) -> None:
    """Raise a BindingError unless `t`, argument `name`, is a dense strided tensor (`where`
    names the kernel and the argument: "kernel 'f' (f.py:3), argument 'x'")."""
    if t.is_nested:
        raise BindingError(f"{where} is a nested tensor; metalforge takes "
                           "dense strided tensors: pad it (torch.nested.to_padded_tensor) or "
                           "pass its components in separate calls")
    if t.layout == torch.strided:
        return
    what = _KINDS.get(t.layout, f"a {str(t.layout).removeprefix('torch.')}")
    raise BindingError(f"{where} is {what} tensor (layout {t.layout}); "
                       f"metalforge takes dense strided tensors: call {name}.to_dense() first")
