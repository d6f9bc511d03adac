# SPDX-License-Identifier: Apache-2.0
"""Arrays in the caller's framework: outputs are allocated like the call's input (numpy
arrays for numpy, torch tensors on the input's device for torch), so results come back in
the framework they went in with. The C++ side reads every array through DLPack."""

from __future__ import annotations

import numpy as np

_NUMPY = {
    "float32": np.float32,
    "float16": np.float16,
    "float64": np.float64,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
}


def is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def dtype_name(x) -> str:
    """'float32', 'bfloat16', ... of a numpy array or torch tensor."""
    if is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return np.dtype(x.dtype).name


def empty_like_framework(like, shape, dtype: str):
    """An uninitialised array of `shape` and `dtype` in `like`'s framework and on its device."""
    if is_torch(like):
        import torch

        return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=like.device)
    if dtype == "bfloat16":
        raise TypeError("numpy has no bfloat16: pass torch tensors for bfloat16 data")
    return np.empty(tuple(shape), dtype=_NUMPY[dtype])


def zeros_like_framework(like, shape, dtype: str):
    out = empty_like_framework(like, shape, dtype)
    out[...] = 0
    return out


def allocate(like, specs, zero: bool = False):
    """{name: array} for the (name, shape, dtype) specs the C++ side lists for a stage;
    `zero`: zero-filled (an empty batch, where the stages write nothing)."""
    make = zeros_like_framework if zero else empty_like_framework
    return {name: make(like, shape, dtype) for name, shape, dtype in specs}


def workspace(like, nbytes: int):
    """The caller-owned scratch a stage asks for (uint8; numpy and torch align it to 64 B)."""
    return empty_like_framework(like, (max(int(nbytes), 1),), "uint8")[: int(nbytes)]


def as_mask(valid):
    """A [T] padding mask as uint8 0 / 1 (bool masks are reinterpreted, not copied)."""
    if valid is None:
        return None
    if is_torch(valid):
        import torch

        return valid.view(torch.uint8) if valid.dtype == torch.bool else valid
    valid = np.asarray(valid)
    return valid.view(np.uint8) if valid.dtype == np.bool_ else valid


def as_int32(ids, what: str):
    """Integer ids as int32, converted once where they are int64 / int16 (torch.topk gives
    int64); int32 arrays pass through uncopied. Other dtypes raise moeroute.Error."""
    from . import _core

    name = dtype_name(ids)
    if name == "int32":
        return ids
    if name not in ("int64", "int16", "int8", "uint8"):
        raise _core.Error(f"{what}: expected integer expert ids, got dtype {name}")
    if is_torch(ids):
        import torch

        return ids.to(torch.int32)
    return np.asarray(ids).astype(np.int32)


def on_cuda(x) -> bool:
    """True for a torch tensor on a CUDA device."""
    return is_torch(x) and x.device.type == "cuda"


def stream_of(x):
    """The CUDA stream a call on `x` runs on: torch's current stream on x's device (an int
    handle), or None for host arrays. The stages launch there and never synchronise."""
    if not on_cuda(x):
        return None
    import torch

    return int(torch.cuda.current_stream(x.device).cuda_stream)
