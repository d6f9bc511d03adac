# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the Python tests: where the data lives, seeded inputs, and the device
parameter (CUDA cases are skipped, and counted as skipped, without a GPU or a CUDA build)."""

import os
import pathlib

import numpy as np
import pytest

import moeroute

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("MOEROUTE_SHARED_DATA", ROOT / "tests" / "data"))


def logits_grid(T, E, seed, scale=1.0):
    """Normal logits rounded to a 1/16 grid and clipped to |x| < 8: exact in float16 and
    bfloat16 as in float32, so every dtype routes the same values."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.standard_normal((T, E)) * scale * 16.0), -127, 127).astype(
        np.float32) / 16.0


def cuda_usable():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and moeroute._core.cuda


DEVICES = [pytest.param("cpu"),
           pytest.param("cuda", marks=pytest.mark.skipif(
               not cuda_usable(), reason="no CUDA device, or moeroute built without CUDA"))]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
