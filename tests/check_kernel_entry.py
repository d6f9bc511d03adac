#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every kernel moeroute launches enters through kernels::enter_after_prior_grid().

cuda::launch may start a kernel as a programmatic dependent of the one before it in the stream
(include/moeroute/cuda/launch.cuh): its blocks can then run while that kernel is still
writing, and only the griddepcontrol.wait in enter_after_prior_grid() orders them. A kernel
that reads anything before it would race, on a device only and only sometimes — so this
check holds every __global__ function in the given files to calling it as its first
statement.

    check_kernel_entry.py FILE_OR_DIR...   (exit 1 with the kernels that do not)
"""

import pathlib
import re
import sys

ENTRY = re.compile(r"(?:(?:moeroute::)?kernels::)?enter_after_prior_grid\(\);")


def strip_comments(text: str) -> str:
    """Comments blanked out (same length, newlines kept), so parentheses and braces in them
    do not count."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"//[^\n]*|/\*.*?\*/", blank, text, flags=re.S)


def kernels_of(path: pathlib.Path):
    """(name, line, first statement) of each __global__ function defined in path."""
    text = strip_comments(path.read_text())
    for m in re.finditer(r"\b__global__\b", text):
        depth, j = 0, m.end()
        while j < len(text):
            c = text[j]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == ";" and depth == 0:
                j = -1  # a declaration, no body
                break
            elif c == "{" and depth == 0:
                break
            j += 1
        if j < 0 or j >= len(text):
            continue
        head = text[m.end():j]
        names = re.findall(r"(\w+)\s*\(", head)
        name = next((n for n in names if n != "__launch_bounds__"), "?")
        body = text[j + 1:].lstrip()
        line = text.count("\n", 0, m.start()) + 1
        yield name, line, body


def main(argv):
    files = []
    for a in argv[1:]:
        p = pathlib.Path(a)
        files += sorted(p.glob("*.cu*")) if p.is_dir() else [p]
    bad, seen = [], 0
    for f in files:
        for name, line, body in kernels_of(f):
            seen += 1
            if not ENTRY.match(body):
                bad.append(f"{f}:{line}: {name} does not begin with enter_after_prior_grid();")
    if seen == 0:
        print("check_kernel_entry: no kernel found (wrong paths?)", file=sys.stderr)
        return 1
    for b in bad:
        print(b, file=sys.stderr)
    print(f"check_kernel_entry: {seen - len(bad)} of {seen} kernels enter after the prior grid")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
