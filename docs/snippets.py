#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Keeps the code in the docs equal to the compiled examples.

A doc includes a region of a source file with a marker line before a fenced code block:

    <!-- snippet: examples/cuda_dispatch.cu#cuda-dispatch -->
    ```cpp
    ...the lines between `// [snippet:cuda-dispatch]` and `// [/snippet]` in that file
    (`# [snippet:...]` and `# [/snippet]` in a Python file)...
    ```

The region is copied without its common indentation. `--check` (CTest's docs_snippets) fails
on any block that differs from its source, any marker whose region is missing, and any cpp
block longer than MAX_FREE_LINES lines that has no marker (long code must be compiled code).
`--update` rewrites the blocks from the sources.

    python3 docs/snippets.py --check  [docs/*.md ...]
    python3 docs/snippets.py --update [docs/*.md ...]
"""
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- snippet: (\S+)#(\S+) -->$")
MAX_FREE_LINES = 12  # signatures and struct listings; anything longer comes from an example


def region(path, name):
    lines = (ROOT / path).read_text().splitlines()
    c = "#" if str(path).endswith(".py") else "//"  # the file's comment marker
    begin = [i for i, l in enumerate(lines) if l.strip() == f"{c} [snippet:{name}]"]
    end = [i for i, l in enumerate(lines) if l.strip() == f"{c} [/snippet]"]
    if len(begin) != 1:
        raise SystemExit(f"{path}: {len(begin)} '{c} [snippet:{name}]' markers (need 1)")
    after = [i for i in end if i > begin[0]]
    if not after:
        raise SystemExit(f"{path}: '{c} [snippet:{name}]' has no '{c} [/snippet]'")
    body = "\n".join(lines[begin[0] + 1 : after[0]])
    return textwrap.dedent(body).strip("\n").splitlines()


def process(doc, update):
    lines = doc.read_text().splitlines()
    out, errors, i = [], [], 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m and i + 1 < len(lines) and lines[i + 1].startswith("```"):
            want = region(m.group(1), m.group(2))
            j = i + 2
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            have = lines[i + 2 : j]
            if have != want:
                errors.append(f"{doc.name}:{i + 1}: differs from {m.group(1)}#{m.group(2)}")
            out += [line, lines[i + 1]] + want + [lines[j] if j < len(lines) else "```"]
            i = j + 1
            continue
        if line.startswith("```cpp"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j - i - 1 > MAX_FREE_LINES:
                errors.append(f"{doc.name}:{i + 1}: a {j - i - 1}-line cpp block without a snippet marker")
            out += lines[i : j + 1]
            i = j + 1
            continue
        out.append(line)
        i += 1
    if update:
        doc.write_text("\n".join(out) + "\n")
        return [e for e in errors if "without a snippet marker" in e]
    return errors


def main(argv):
    mode = argv[1] if len(argv) > 1 else "--check"
    docs = [pathlib.Path(a) for a in argv[2:]] or sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    errors = [e for d in docs for e in process(d, mode == "--update")]
    for e in errors:
        print(e)
    if errors:
        print("docs: run `python3 docs/snippets.py --update` after changing an example")
        return 1
    print(f"docs: {len(docs)} files, every snippet equals its example")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
