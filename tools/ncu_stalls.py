"""Where do a kernel's warps stall? It reads Nsight Compute's SASS source page (`ncu -i REPORT --page source --csv
--print-source sass > F.csv`, after `ncu --set full ...`) on any machine and prints the stall samples by reason, then
by opcode, and with --loops the loop bodies, so that the hot loop can be listed with --range. From the checkout's
root: `python -m tools.ncu_stalls F.csv.gz --loops` or `python -m tools.ncu_stalls F.csv.gz --range 384:520`.
"""

from __future__ import annotations

DETAILS = """The GPU side writes the page with `ncu -i REPORT --page source --csv --print-source sass > F.csv` (after
`ncu --set full ...`). This prints the warp-stall
sampling by reason (all samples), then by opcode: each opcode's share of the stall samples taken at its
instructions and of the executed warp instructions, and with --loops the runs of instructions executed the same
number of times (a loop body), so that the hot loop's instructions can be listed with `--range A:B`:

    python -m tools.ncu_stalls sass_jax.pallas_mosaic_gpu.fp8.csv.gz --loops
    python -m tools.ncu_stalls sass_jax.pallas_mosaic_gpu.fp8.csv.gz --range 384:520
"""

import argparse
import collections
import csv
import gzip
import re
import sys

STALLS_SHOWN = ("stall_wait", "stall_short_sb", "stall_selected", "stall_long_sb", "stall_barrier", "stall_math",
                "stall_not_selected")


def read_page(path: str) -> tuple[list[str], list[list[str]]]:
    """(header, instruction rows) of an ncu SASS source page in CSV (gzip-compressed when the name ends in .gz): the
    first line names the kernel, the second is the header."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or "Source" not in rows[1]:
        raise ValueError(f"{path}: not an ncu SASS source page (no 'Source' column on its second line)")
    header = rows[1]
    return header, [r for r in rows[2:] if len(r) >= len(header)]


def opcode(source: str) -> str:
    """'@!P1  BRA 0x7f..' -> 'BRA'; 'F2FP.F16.E4M3.UNPACK_B R1, R2' -> 'F2FP'."""
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return text.split(" ")[0].split(".")[0]


def summary(header, rows) -> dict:
    """{'samples', 'executed', 'reasons': Counter, 'opcode_samples': Counter, 'opcode_executed': Counter}."""
    ix = {h: i for i, h in enumerate(header)}
    reasons_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, c: int(r[ix[c]] or 0)
    out = dict(samples=0, executed=0, reasons=collections.Counter(), opcode_samples=collections.Counter(),
               opcode_executed=collections.Counter())
    for r in rows:
        s, e, op = num(r, "Warp Stall Sampling (All Samples)"), num(r, "Instructions Executed"), opcode(r[ix["Source"]])
        out["samples"] += s
        out["executed"] += e
        out["opcode_samples"][op] += s
        out["opcode_executed"][op] += e
        for c in reasons_cols:
            out["reasons"][c] += num(r, c)
    return out


def loops(header, rows, min_len: int = 8) -> list[tuple[int, int, int]]:
    """Runs (first, last, count) of at least min_len consecutive instructions executed `count` (> 0) times."""
    ix = header.index("Instructions Executed")
    runs, start, prev = [], 0, None
    for n, r in enumerate(rows + [None]):
        e = int(r[ix] or 0) if r is not None else None
        if e != prev:
            if prev and n - start >= min_len:
                runs.append((start, n - 1, prev))
            start, prev = n, e
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.ncu_stalls", description=__doc__,
                                epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("page", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    p.add_argument("--top", type=int, default=20, help="opcodes listed (default 20)")
    p.add_argument("--loops", action="store_true", help="list the runs of equally executed instructions")
    p.add_argument("--range", help="A:B: list instructions A..B-1 with their stall samples by reason")
    args = p.parse_args(argv)
    header, rows = read_page(args.page)
    s = summary(header, rows)
    if not s["samples"]:
        print(f"{args.page}: no stall samples (was the report taken with --set full?)", file=sys.stderr)
        return 1
    print(f"{args.page}: {s['samples']} stall samples, {s['executed']} warp instructions executed")
    for reason, v in s["reasons"].most_common(12):
        print(f"  {reason:28s} {v:9d} {100 * v / s['samples']:5.1f}%")
    print("  by opcode: share of the stall samples at its instructions, of the executed instructions")
    for op, v in s["opcode_samples"].most_common(args.top):
        print(f"  {op:12s} {100 * v / s['samples']:5.1f}%   {100 * s['opcode_executed'][op] / s['executed']:5.1f}%")
    if args.loops:
        print("  runs of equally executed instructions (first, last, count):")
        for a, b, c in loops(header, rows):
            print(f"  {a:6d} {b:6d} {c:10d}")
    if args.range:
        a, b = (int(x) for x in args.range.split(":"))
        ix = {h: i for i, h in enumerate(header)}
        shown = [c for c in STALLS_SHOWN if c in ix]
        print("  n  executed samples | " + " ".join(c.removeprefix("stall_")[:8] for c in shown) + " | SASS")
        for n in range(max(0, a), min(b, len(rows))):
            r = rows[n]
            cells = " ".join(f"{int(r[ix[c]] or 0):8d}" for c in shown)
            print(f"{n:5d} {int(r[ix['Instructions Executed']] or 0):9d} "
                  f"{int(r[ix['Warp Stall Sampling (All Samples)']] or 0):6d} | {cells} | {r[ix['Source']].strip()[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
