#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Resource usage of the built routing kernels, readable without a GPU.

Input: one translation unit compiled for one architecture with
`nvcc -cubin --resource-usage` (cmake/kernel_resources.cmake does that in the build): ptxas'
report (registers, stack frame, spill stores / loads per entry function) and the cubin, whose
`.text.<kernel>` section holds the kernel's SASS. From sm_70 on every SASS instruction is 16
bytes, so a section's size / 16 is the kernel's static instruction count: a code-size proxy for
the per-token instruction count, which only a device run measures (ncu: `smsp__inst_executed`).

  kernel_resources.py LOG CUBIN                print the table
  kernel_resources.py LOG CUBIN --check        ... and exit 1 on any stack frame or spill in a
                                               gating, gating-backward or dispatch kernel
  kernel_resources.py LOG CUBIN --nvdisasm P   ... with static counts of a few instruction
                                               classes from nvdisasm (found on PATH otherwise;
                                               the GPU machine's toolkit has it, Debian's build
                                               here may not): shuffles, WARPSYNC (mostly the
                                               out-of-line fallback of a shuffle the compiler
                                               cannot prove converged: code size, run only when
                                               a warp is diverged), calls, fp64, LDL/STL

The generic gating kernel (E > 512, gating_kernel<..., Generic = true>) keeps its row in local
memory by design and is listed but not checked.
"""
import argparse
import re
import shutil
import struct
import subprocess
import sys

SASS_BYTES = 16  # one instruction, sm_70 and later


def parse_log(text):
    """{mangled name: {regs, stack, spill_stores, spill_loads}} for the entry functions."""
    entries = set(re.findall(r"Compiling entry function '([^']+)'", text))
    props = {}
    blocks = re.split(r"ptxas info\s*: Function properties for ", text)[1:]
    for block in blocks:
        name = block.split("\n", 1)[0].strip()
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      block)
        r = re.search(r"Used (\d+) registers", block)
        if name in entries and m:
            props[name] = {
                "regs": int(r.group(1)) if r else None,
                "stack": int(m.group(1)),
                "spill_stores": int(m.group(2)),
                "spill_loads": int(m.group(3)),
            }
    missing = entries - props.keys()
    if missing:
        raise SystemExit(f"no resource report for {sorted(missing)}")
    return props


def text_sizes(cubin):
    """{mangled name: bytes of its .text section} from the cubin's ELF section headers."""
    with open(cubin, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"{cubin}: not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]

    def name(off):
        end = data.index(b"\0", strtab_off + off)
        return data[strtab_off + off:end].decode()

    sizes = {}
    for h in headers:
        n = name(h[0])
        if n.startswith(".text."):
            sizes[n[len(".text."):]] = h[5]
    return sizes


# instruction classes counted from nvdisasm's listing (opcode without its modifiers)
CLASSES = {
    "shfl": {"SHFL"},
    "wsync": {"WARPSYNC"},
    "call": {"CALL"},
    "fp64": {"DADD", "DMUL", "DFMA", "DSETP", "DMNMX"},
    "local": {"LDL", "STL"},
}


def opcode_counts(nvdisasm, cubin):
    """{mangled name: {class: count}} from nvdisasm's listing of the cubin."""
    listing = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True,
                             check=True).stdout
    counts, current = {}, None
    for line in listing.splitlines():
        m = re.match(r"\s*\.section\s+\.text\.([^,]+),", line)
        if m:
            current = counts.setdefault(m.group(1), {c: 0 for c in CLASSES})
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m and current is not None:
            op = m.group(1)
            for c, ops in CLASSES.items():
                if op in ops:
                    current[c] += 1
    return counts


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    short = {}
    for n, d in zip(names, out.splitlines()):
        d = re.sub(r"\(.*\)$", "", d).removeprefix("void ")  # return type, argument list
        d = d.replace("moeroute::kernels::", "").replace("__nv_bfloat16", "bf16")
        d = d.replace("__half", "half")
        if len(d) > 60:  # CUB's names run to hundreds of characters
            d = d[:57] + "..."
        short[n] = d
    return short


def checked(display):
    """moeroute's own kernels (demangled without their namespace), except the generic
    (local-memory row) gating kernel; CUB's (the dispatch key sort's) are listed only."""
    if display.startswith("gating_kernel<"):
        return not display.endswith("true>")
    return "::" not in display.split("<", 1)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("cubin")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm"),
                    help="nvdisasm for the instruction-class columns (default: on PATH)")
    args = ap.parse_args()
    with open(args.log) as f:
        props = parse_log(f.read())
    sizes = text_sizes(args.cubin)
    names = sorted(props)
    display = demangle(names)
    rows = sorted(names, key=lambda n: display[n])
    width = max(len(display[n]) for n in rows)
    ops = opcode_counts(args.nvdisasm, args.cubin) if args.nvdisasm else None
    extra = "".join(f"  {c:>6}" for c in CLASSES) if ops else ""
    print(f"{'kernel':<{width}}  regs  stack  spill st/ld  SASS instr.{extra}  checked")
    bad = []
    for n in rows:
        p = props[n]
        instr = sizes.get(n, 0) // SASS_BYTES
        is_checked = checked(display[n])
        print(f"{display[n]:<{width}}  {p['regs']:>4}  {p['stack']:>5}  "
              f"{p['spill_stores']:>5}/{p['spill_loads']:<5}  {instr:>11}"
              + ("".join(f"  {ops.get(n, {}).get(c, 0):>6}" for c in CLASSES) if ops else "")
              + f"  {'yes' if is_checked else 'no'}")
        if is_checked and (p["stack"] or p["spill_stores"] or p["spill_loads"]):
            bad.append(display[n])
    if not any(checked(display[n]) for n in rows):
        print("no moeroute kernel in the report", file=sys.stderr)
        return 1
    if args.check and bad:
        print(f"\n{len(bad)} kernel(s) with a stack frame or spills:", file=sys.stderr)
        for b in bad:
            print(f"  {b}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
