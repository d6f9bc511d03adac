# SPDX-License-Identifier: Apache-2.0
"""Loads the C++ extension built for this CPU as moeroute._core.

The package ships the extension once per x86 vector level (include/moeroute/cpu/isa.hpp):
_core (the compiler's default target, SSE2 on x86-64), _core_avx2 (x86-64-v3) and
_core_avx512 (x86-64-v4). The CPU backend's vector paths are fixed when it is compiled, so the
level is chosen per process, here: the highest one that both the CPU runs (moeroute._cpu) and
the package has. Ids, slots, counts, layouts and the logit gradient are the same bits on every
level; gates and loss sums may differ in the last bit or two (the float exp with or without
FMA: docs/numerics.md, "Across ISA builds").

MOEROUTE_ISA=baseline|avx2|avx512 in the environment asks for a level instead (to compare
levels, or to pin one); a level the CPU cannot run or the package lacks is an error, never a
silent fallback. A source build with MOEROUTE_PYTHON_NATIVE=ON has _core alone, built for the
build machine."""

import importlib
import importlib.util
import os
import sys

LEVELS = ("baseline", "avx2", "avx512")


def _module_name(level: str) -> str:
    return "_core" if level == "baseline" else f"_core_{level}"


def _have(level: str) -> bool:
    return importlib.util.find_spec(f"{__package__}.{_module_name(level)}") is not None


def load():
    """Imports the chosen build, registers it as moeroute._core, and returns it."""
    try:
        from . import _cpu

        host = _cpu.host_isa()
    except ImportError:  # a build without the ISA modules (MOEROUTE_PYTHON_NATIVE)
        host = "baseline"
    asked = os.environ.get("MOEROUTE_ISA", "").strip()
    if asked:
        if asked not in LEVELS:
            raise ImportError(f"MOEROUTE_ISA={asked!r}: expected one of {', '.join(LEVELS)}")
        if LEVELS.index(asked) > LEVELS.index(host):
            raise ImportError(f"MOEROUTE_ISA={asked}: this CPU runs at most {host}")
        if not _have(asked):
            raise ImportError(f"MOEROUTE_ISA={asked}: this moeroute has no {asked} build "
                              f"(moeroute.{_module_name(asked)})")
        level = asked
    else:
        level = next(lv for lv in reversed(LEVELS[: LEVELS.index(host) + 1]) if _have(lv))
    name = f"{__package__}.{_module_name(level)}"
    module = importlib.import_module(name)
    if level != "baseline":
        # every `from . import _core` in the package (and old pickles' moeroute._core.Config)
        # now finds this build; the baseline file is never loaded
        sys.modules[f"{__package__}._core"] = module
    return module
