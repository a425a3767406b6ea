"""What machine code does the Mosaic GPU kernel's PTX become: its registers, spills and, per loop, the instructions that
decide a step's speed? It assembles a PTX dumped on the GPU machine (`MOSAIC_GPU_DUMP_PTX=1
MOSAIC_GPU_DUMP_TO=<dir>`) for sm_90a with the installed Triton's ptxas, on any machine. From the checkout's root:
`python -m tools.mosaic_sass body_0.ptx [--sass kernel.sass] [--all-loops]`.
"""

from __future__ import annotations

DETAILS = """Mosaic GPU compiles a kernel to PTX on the GPU machine; with `MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=<dir>` it
writes each kernel's PTX there (`body_<n>.ptx`). This assembles such a PTX for sm_90a with the ptxas of the Triton
package installed here (torch's: no GPU needed), and prints the registers, the spills and, for each loop of the
machine code (a backward branch), its length and the instructions that decide a step's speed (tensor-core ops,
moves into uniform registers, local-memory spills, barriers):

    python -m tools.mosaic_sass kernel-h128.ptx.gz --sass kernel.sass

Triton's ptxas may be older than the PTX's `.version` (Mosaic GPU on CUDA 13 writes 9.0, Triton 3.6's ptxas reads
up to 8.7): the version line is then lowered to what ptxas reads. This changes nothing that matters here: the same registers and spills as the GPU machine's ptxas reported for the same PTX (255 and 68 / 76
bytes; the probe 196 against 194). A static view, for choosing what to time.
"""

import argparse
import collections
import gzip
import os
import re
import subprocess
import sys
import tempfile

# SASS opcodes (before the first '.') counted per loop; the rest are summed as "other"
OPCODES = ("HGMMA", "R2UR", "UIADD3", "FADD", "FFMA", "FMUL", "MUFU", "SHFL", "LDS", "STS", "LDL", "STL", "BAR",
           "SYNCS", "UTMALDG", "BRA")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);")


def tools() -> dict:
    """Paths of the installed Triton's ptxas and cuobjdump."""
    import triton

    base = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    paths = {name: os.path.join(base, name) for name in ("ptxas", "cuobjdump")}
    for name, path in paths.items():
        if not os.path.exists(path):
            raise RuntimeError(f"the installed Triton has no {name} at {path}")
    return paths


def read_ptx(path: str) -> str:
    """A PTX file's text (gzip-compressed when its name ends in .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read()


def with_version(ptx: str, version: str) -> str:
    """The PTX with its `.version` line replaced (the ISA version ptxas reads)."""
    out, n = re.subn(r"^\.version\s+\S+", f".version {version}", ptx, count=1, flags=re.M)
    if n != 1:
        raise ValueError("no .version line in the PTX")
    return out


def assemble(ptx: str, workdir: str) -> dict:
    """ptxas -v for sm_90a (the version line lowered if this ptxas reads an older one), then cuobjdump -sass:
    {"registers", "spill_stores", "spill_loads", "ptx_version", "sass"}."""
    m = re.search(r"^\.version\s+(\S+)", ptx, flags=re.M)
    if m is None:
        raise ValueError("not PTX: no .version line (Mosaic GPU's body_<n>.ptx, from MOSAIC_GPU_DUMP_PTX=1)")
    version = m.group(1)
    t = tools()
    src, cubin = os.path.join(workdir, "kernel.ptx"), os.path.join(workdir, "kernel.cubin")
    for _ in range(2):
        with open(src, "w") as f:
            f.write(ptx)
        run = subprocess.run([t["ptxas"], "-arch=sm_90a", "-O3", "-v", src, "-o", cubin], capture_output=True,
                             text=True)
        if run.returncode == 0:
            break
        m = re.search(r"Unsupported \.version \S+; current version is '([\d.]+)'", run.stderr)
        if m is None:
            raise RuntimeError(f"ptxas failed:\n{run.stderr[-2000:]}")
        version = m.group(1)
        ptx = with_version(ptx, version)
    else:
        raise RuntimeError(f"ptxas failed:\n{run.stderr[-2000:]}")
    log = run.stderr + run.stdout
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    sass = subprocess.run([t["cuobjdump"], "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return {"registers": int(regs.group(1)) if regs else -1,
            "spill_stores": int(spills.group(1)) if spills else 0,
            "spill_loads": int(spills.group(2)) if spills else 0,
            "ptx_version": version, "sass": sass}


def instructions(sass: str) -> list[tuple[int, str, str, bool]]:
    """(address, opcode, operands, predicated) of each SASS instruction."""
    return [(int(a, 16), op, rest, bool(pred)) for a, pred, op, rest in _INSTRUCTION.findall(sass)]


def loops(sass: str) -> list[dict]:
    """The loops of the SASS: each predicated backward branch (`@P BRA` to a lower address) closes one, from its
    target to the branch (the unpredicated ones are the barrier waits' out-of-line retries jumping back). Per loop:
    start, end (addresses), instruction count and counts by opcode (OPCODES, the rest "other")."""
    ins = instructions(sass)
    out = []
    for addr, op, rest, predicated in ins:
        m = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" and predicated else None
        if m is None or int(m.group(1), 16) >= addr:
            continue
        start = int(m.group(1), 16)
        body = [o for a, o, _, _ in ins if start <= a <= addr]
        counts = collections.Counter(o if o in OPCODES else "other" for o in body)
        out.append(dict(start=start, end=addr, instructions=len(body), counts=counts))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.mosaic_sass", description=__doc__, epilog=DETAILS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ptx", nargs="+", help="PTX files (Mosaic GPU's body_<n>.ptx; .gz read as gzip)")
    p.add_argument("--sass", help="also write the (last) kernel's whole SASS here")
    p.add_argument("--all-loops", action="store_true", help="every loop, not only those with a wgmma (HGMMA)")
    args = p.parse_args(argv)
    for path in args.ptx:
        with tempfile.TemporaryDirectory() as d:
            out = assemble(read_ptx(path), d)
        if args.sass:
            with open(args.sass, "w") as f:
                f.write(out["sass"])
        print(f"{path}: {out['registers']} registers, spills {out['spill_stores']} bytes stored / "
              f"{out['spill_loads']} loaded (PTX assembled as .version {out['ptx_version']})")
        for lp in loops(out["sass"]):
            if args.all_loops or lp["counts"]["HGMMA"]:
                c = lp["counts"]
                print(f"  loop {lp['start']:#07x}-{lp['end']:#07x}: {lp['instructions']:5d} instructions  " +
                      "  ".join(f"{op} {c[op]}" for op in (*OPCODES, "other") if c[op]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
