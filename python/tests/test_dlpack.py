# SPDX-License-Identifier: Apache-2.0
"""Arrays the binding must refuse, made with ctypes as any DLPack producer could hand them
over: a device array beside host arrays, a device array in a CPU-only build, dtypes the
library has no kernels for, vector lanes, strides that are not row-major, an unknown device
type. Each must raise moeroute.Error naming the argument, before anything runs."""

import ctypes

import numpy as np
import pytest

import moeroute
from moeroute import Config, Error, _core


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Producer:
    """A DLPack producer of a [rows, cols] array with the given device and dtype fields."""

    def __init__(self, rows, cols, device=1, code=2, bits=32, lanes=1, strides=None):
        self.shape = (rows, cols)
        self.dtype = "dlpack"
        self._data = np.zeros(rows * cols * 8, np.uint8)  # never read for refused arrays
        self._shape = (ctypes.c_int64 * 2)(rows, cols)
        self._strides = (ctypes.c_int64 * 2)(*strides) if strides else None
        self._m = DLManagedTensor()
        t = self._m.dl_tensor
        t.data = self._data.ctypes.data
        t.device = DLDevice(device, 0)
        t.ndim = 2
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = self._shape
        t.strides = self._strides
        t.byte_offset = 0

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self._m), b"dltensor", None)


CFG = Config.deepspeed_top2(8)


def test_device_arrays_beside_host_arrays_or_in_a_cpu_only_build():
    logits = Producer(16, 8, device=2)  # kDLCUDA
    want = "on a different device" if _core.cuda else "this build of the package has the CPU"
    with pytest.raises(Error, match=f"gating: .*{want}"):
        moeroute.gating(logits, CFG)


def test_unknown_device_type():
    with pytest.raises(Error, match="logits: arrays must be on the CPU or a CUDA device"):
        moeroute.gating(Producer(16, 8, device=4), CFG)  # kDLOpenCL


@pytest.mark.parametrize("code,bits,lanes,what", [
    (5, 64, 1, "unsupported dtype"),       # complex64
    (2, 8, 1, "unsupported dtype"),        # an 8-bit float
    (2, 32, 4, "unsupported dtype"),       # float32 x 4 lanes
    (0, 32, 1, "dtype int32, expected one of float32"),
])
def test_dtypes_without_kernels(code, bits, lanes, what):
    with pytest.raises(Error, match=f"logits: {what}"):
        moeroute.gating(Producer(16, 8, code=code, bits=bits, lanes=lanes), CFG)


def test_strides_that_are_not_row_major():
    with pytest.raises(Error, match="logits: must be contiguous"):
        moeroute.gating(Producer(16, 8, strides=(1, 16)), CFG)
    # a producer that states row-major strides explicitly is accepted
    g = moeroute.gating(Producer(16, 8, strides=(8, 1)), CFG)
    assert g.ids.shape == (16, 2)


def test_outputs_must_be_writable():
    r = moeroute.route(np.zeros((16, 8), np.float32), CFG)
    out = np.zeros((r.laid.max_rows, 4), np.float32)
    out.setflags(write=False)
    with pytest.raises(Error, match="permute: out: cannot be exported through DLPack"):
        moeroute.permute(np.zeros((16, 4), np.float32), r.laid, CFG, out=out)


def test_more_dimensions_than_the_binding_holds():
    """An array's extents are held inline (8 of them): a ninth is refused by name, through
    DLPack and through the buffer protocol alike, never read past."""
    x = np.zeros((1,) * 8 + (8,), np.float32)
    with pytest.raises(Error, match="logits: more than 8 dimensions"):
        _core.route_host(CFG, x)
    x.setflags(write=False)  # (numpy hands read-only arrays over through the buffer protocol)
    with pytest.raises(Error, match="logits: more than 8 dimensions"):
        _core.route_host(CFG, x)
    with pytest.raises(Error, match=r"logits: shape \[1, 1, 1, 1, 1, 1, 1, 8\], expected \[\*, 8\]"):
        _core.route_host(CFG, np.zeros((1,) * 7 + (8,), np.float32))
