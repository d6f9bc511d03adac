#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks design.md's "Where each operation lives" table against the tree.

Every `file` in a cell must exist under its column's root (params, reference, CPU and CUDA:
include/moeroute/; kernel: kernels/moeroute/kernels/; Python: python/moeroute/), and every
`name` after a file in the same cell must be defined in that file (a C++ function or class of
that name, a Python def or class). Exit 1 with the first problems listed.

    python3 docs/design_table.py [docs/design.md]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
COLUMN_ROOTS = {
    "params": "include/moeroute",
    "reference": "include/moeroute",
    "CPU backend": "include/moeroute",
    "CUDA launcher": "include/moeroute",
    "kernel": "kernels/moeroute/kernels",
    "Python": "python/moeroute",
}
FILE = re.compile(r"\.(hpp|cuh|py)$")


def defines(path: pathlib.Path, name: str) -> bool:
    text = path.read_text()
    if path.suffix == ".py":
        return re.search(rf"^(def|class) {re.escape(name)}\b", text, re.M) is not None
    return re.search(rf"\b{re.escape(name)}\s*\(|\bclass {re.escape(name)}\b", text) is not None


def main(argv):
    doc = pathlib.Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "design.md"
    lines = doc.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("## Where each operation lives"))
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("| operation"))
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    roots = [next((r for k, r in COLUMN_ROOTS.items() if c.startswith(k)), None) for c in columns]
    problems, cells = [], 0
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        row = [c.strip() for c in line.strip("|").split("|")]
        for col, cell in enumerate(row):
            if roots[col] is None:
                continue
            cells += 1
            names = re.findall(r"`([^`]+)`", cell)
            files = [n for n in names if FILE.search(n)]
            if not files and "(" not in cell:
                problems.append(f"{row[0]} / {columns[col]}: no file named in '{cell}'")
            current = None
            for n in names:
                if FILE.search(n):
                    current = ROOT / roots[col] / n
                    if not current.is_file():
                        problems.append(f"{row[0]} / {columns[col]}: {roots[col]}/{n} does not exist")
                        current = None
                elif current is not None and not defines(current, n):
                    problems.append(f"{row[0]} / {columns[col]}: {current.relative_to(ROOT)} "
                                    f"defines no '{n}'")
    if cells == 0:
        problems.append("the table has no cells")
    for p in problems:
        print("design table:", p)
    if problems:
        return 1
    print(f"design table: {cells} cells, every file exists and defines what it names")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
