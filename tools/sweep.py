"""Which tuning of a Pallas kernel is fastest on a few shapes, against the heuristic's pick? It times variants that
each change one field of the heuristic's pick, with the bench's method (N calls in one launch) and FA3 beside, and
prints the best per shape, to revise the heuristic from measurements. On a GPU, from the checkout's root:
`python -m tools.sweep --impl pallas_mosaic_gpu [--fields a,b] [--shapes H16_B128_S16384_q1] [--fp8] [--rounds 3
--cooldown 1] [--json sweep.json]`.
"""

from __future__ import annotations

DETAILS = """  python -m tools.sweep --impl pallas_triton --json sweep.json
  python -m tools.sweep --impl pallas_triton --fp8 --shapes H16_B128_S16384_q1   # on an fp8 copy of the cache

Each variant changes one field of the heuristic's pick; the table shows the time of
each and the best per shape, to revise the heuristic from measurements.

--rounds R (for A/Bs): every variant of a shape (and FA3) is compiled and calibrated first,
then timed R times in turn (FA3, variant 1, variant 2, ..., FA3, variant 1, ...), and each
keeps the median of its R times (all R in the JSON as round_seconds): a slow spell of the
GPU then falls on every variant alike instead of on whichever ran during it.

--cooldown S: the GPU idles S seconds before each timing, so no variant is timed right after
another one's (or FA3's) heat (the bench's --cooldown: the fp8 Mosaic kernel runs 1.16x slower right
after FA3's timing than after 3 s idle).
"""

import argparse
import dataclasses
import importlib
import json
import os
import statistics
import sys
import time

from parity import timing
from parity.bench import parse_cooldown
from parity.h200 import heuristic_tuning
from parity.shapes import Shape, parse_shape

SHAPES = [
    Shape(16, 128, 16384), Shape(16, 8, 4096), Shape(16, 1, 1024), Shape(16, 64, 4096, 2),
    Shape(128, 64, 16384), Shape(128, 8, 4096), Shape(128, 1, 1024), Shape(128, 32, 4096, 2),
]

VARIANTS = {
    "pallas_triton": dict(block_kv=(16, 32, 64, 128), num_warps=(4, 8), num_stages=(1, 2, 3, 4), num_parts="x0.5,x2",
                          block_h=(32, 64), block_q=(1, 2)),
    "pallas_mosaic_gpu": dict(num_splits="x0.5,x2,=1", launch_order=("requests_first", "heads_first"),
                              transpose=("none", "scores", "scores_and_pv"), warpgroup_halves=(True, False),
                              v_from_ring=(True, False), pv_in_flight=(1, 2, 4, 8), q_in_kernel=(True, False),
                              ring_pairs=(True, False)),
}


def parse_overrides(text: str) -> dict:
    """'num_warps=8,q_in_kernel=True' -> {'num_warps': 8, 'q_in_kernel': True} (int or bool values)."""
    out = {}
    for item in filter(None, text.split(",")):
        field, sep, value = item.partition("=")
        try:
            if not sep or not field:
                raise ValueError
            out[field] = value == "True" if value in ("True", "False") else int(value)
        except ValueError:
            raise ValueError(f"--set takes field=int (or True / False) pairs separated by commas, got {item!r}") from None
    return out


def sweep_spec(impl: str, fields, narrowed: dict) -> dict:
    """The values of each field in `fields` to time (VARIANTS' order), a narrowed field's only its one: a tuple
    of values, or a relative spec such as "x0.5,x2,=1" (variants() reads it against the heuristic), narrowed to one
    of its items ("x2")."""
    return {f: (narrowed.get(f, v) if isinstance(v, str) else
                tuple(x for x in v if f not in narrowed or str(x) == narrowed[f]))
            for f, v in VARIANTS[impl].items() if f in fields}


# A field that needs another: turning the other off turns it off too (transpose="none" with the heuristic's
# warpgroup_halves is the plain path, not an invalid combination skipped).
DEPENDENTS = {"transpose": ("warpgroup_halves",)}


def variants(base, spec: dict):
    seen = {base}
    yield "heuristic", base
    for field, values in spec.items():
        if isinstance(values, str):  # relative to the heuristic's value
            cur = getattr(base, field)
            values = [max(1, int(cur * float(v[1:]))) if v[0] == "x" else int(v[1:]) for v in values.split(",")]
        for v in values:
            off = {d: False for d in DEPENDENTS.get(field, ()) if v in (False, "none", "scores") and hasattr(base, d)}
            try:
                t = dataclasses.replace(base, **{field: v}, **off)
            except ValueError:  # an invalid combination for this shape
                continue
            if t not in seen:
                seen.add(t)
                yield f"{field}={v}", t


def time_rounds(timed, rounds: int, reps: int, cooldown_s: float = 0.0):
    """Each (row, timer) of `timed` measured `rounds` times in turn, each time after `cooldown_s` idle, its
    per-launch seconds appended to row["round_seconds"]; one that raises gets row["error"] and drops out."""
    timed = list(timed)
    for _ in range(rounds):
        for entry in list(timed):
            row, timer = entry
            if cooldown_s:
                time.sleep(cooldown_s)
            try:
                row["round_seconds"].append(timer.measure(reps)[0])
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                del row["round_seconds"]
                timed.remove(entry)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.sweep", description=__doc__, epilog=DETAILS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", default="pallas_triton", choices=sorted(VARIANTS))
    p.add_argument("--shapes", help="comma-separated shape names such as H128_B8_S1024_q2 (default: all of SHAPES)")
    p.add_argument("--fields", help="comma-separated tuning fields to vary, each optionally narrowed to one of its "
                   "values (field=value, e.g. schedule=split) (default: all of the impl's; \"none\": the "
                   "heuristic's pick alone, beside FA3)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every variant (and FA3) this many times in turn, keeping each one's median")
    p.add_argument("--set", dest="overrides", type=parse_overrides, default={},
                   help="comma-separated field=int (or True / False) pairs replaced in the heuristic's pick before "
                        "the variants "
                        "(e.g. num_warps=8): sweep around another base")
    p.add_argument("--fp8", action="store_true",
                   help="run the kernel on an fp8_e4m3 copy of the cache (parity.timing.quantize_fp8); FA3 stays bf16")
    p.add_argument("--cooldown", type=parse_cooldown, default=0.0, metavar="S",
                   help="idle S seconds before each timing (FA3's and every variant's, in every round)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    fields = args.fields.split(",") if args.fields else list(VARIANTS[args.impl])
    narrowed = dict(f.split("=", 1) for f in fields if "=" in f)  # field -> the one value (as text) to time
    fields = [f.split("=", 1)[0] for f in fields]
    unknown = sorted(set(fields) - set(VARIANTS[args.impl]) - {"none"})
    if unknown:
        p.error(f"--fields: {', '.join(unknown)} not among {args.impl}'s ({', '.join(VARIANTS[args.impl])}) or none")
    for f, text in narrowed.items():
        values = VARIANTS[args.impl][f]
        if text not in (values.split(",") if isinstance(values, str) else [str(v) for v in values]):
            p.error(f"--fields: {f}={text} is not one of {f}'s values ({values})")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    shapes = [parse_shape(n) for n in args.shapes.split(",")] if args.shapes else SHAPES
    import torch

    if not torch.cuda.is_available():
        print("the sweep needs a CUDA GPU")
        return 2
    mod = importlib.import_module(f"mla_jax.{args.impl}")
    rows = []
    for shape in shapes:
        inp = timing.make_inputs(shape)
        config = inp.config.replace(kv_cache_dtype="fp8_e4m3") if args.fp8 else inp.config
        base = heuristic_tuning(mod, config, inp.metadata, args.overrides)
        runners = []  # (row, timer): calibrated first, then timed in rounds
        fa3 = None
        try:
            timer, _ = timing.calibrate(timing.torch_fa3, inp)
            fa3 = dict(round_seconds=[]), timer
        except Exception as e:  # FA3 missing: the sweep still ranks the variants
            print(f"{shape.name}: no FA3 ({type(e).__name__}: {e})", file=sys.stderr)
        spec = sweep_spec(args.impl, fields, narrowed)
        shape_rows = []
        for label, tuning in variants(base, spec):
            row = dict(shape=shape.name, variant=label, tuning=dataclasses.asdict(tuning))
            shape_rows.append(row)
            try:
                timer, _ = timing.calibrate(timing.jax_kernel(args.impl, tuning, fp8=args.fp8), inp)
                row["round_seconds"] = []
                runners.append((row, timer))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:300]
        time_rounds(([fa3] if fa3 else []) + runners, args.rounds, args.reps, args.cooldown)
        fa3_s = statistics.median(fa3[0]["round_seconds"]) if fa3 and "error" not in fa3[0] else None
        for r in shape_rows:
            r["fa3_s"] = fa3_s
            if args.rounds > 1 and fa3_s:
                r["fa3_round_seconds"] = fa3[0]["round_seconds"]
            if "round_seconds" in r:
                sec = statistics.median(r["round_seconds"])
                if args.rounds == 1:
                    del r["round_seconds"]
                r.update(seconds=sec, TBps=shape.bytes(kv_itemsize=1 if args.fp8 else None) / sec / 1e12,
                         TFLOPps=shape.flops() / sec / 1e12)
                if fa3_s:
                    r["fa3_over_impl"] = fa3_s / sec
            rows.append(r)
            print(f"{shape.name:<22} {r['variant']:<18} " + (f"{r['seconds'] * 1e6:9.1f} us {r['TBps']:5.2f} TB/s "
                  f"{r['TFLOPps']:6.1f} TF/s" + (f"  FA3/impl {r['fa3_over_impl']:.2f}" if fa3_s else "")
                  if "seconds" in r else "ERROR " + r["error"][:100]), flush=True)
        del inp
        torch.cuda.empty_cache()
        if args.json:  # after every shape: a run cut short still leaves its numbers
            with open(args.json, "w") as f:
                json.dump({"impl": args.impl, "fp8": args.fp8, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                           **({"cooldown_s": args.cooldown} if args.cooldown else {}), "rows": rows}, f, indent=1)
    print("\nbest per shape:")
    for shape in shapes:
        ok = [r for r in rows if r["shape"] == shape.name and "seconds" in r]
        if ok:
            best = min(ok, key=lambda r: r["seconds"])
            heur = next((r for r in ok if r["variant"] == "heuristic"), None)
            gain = heur["seconds"] / best["seconds"] if heur else float("nan")
            print(f"  {shape.name:<22} {best['variant']:<18} {best['seconds'] * 1e6:8.1f} us "
                  f"(heuristic x{gain:.2f} slower) {best['tuning']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
