"""Session 13 (CPU): issue #5's 61-shape grid on today's defaults, composed from committed runs, each row with FA3
timed beside it in its own run: the 25 H = 16 rows of session 13 (q_len 1, q_len 2 at S <= 4096), the 5 q_len 2
S = 16384 rows of session 12 (no --trace: no span), and session 7's other 31 rows (H = 128; that kernel path is
unchanged since). Prints the geomeans and writes parity/results/h200-bench-mosaic-grid-composite-2026-12-02.json.
  python parity/sessions/2026-12-02-s13-composite.py"""
import json
import math
import pathlib

R = pathlib.Path(__file__).resolve().parents[1] / "results"
SOURCES = ["h200-bench-mosaic-grid-v8-trace-2026-12-01.json", "h200-bench-h16-q2-s16384-tpv-2026-12-02.json",
           "h200-bench-mosaic-grid-h16-s13-2026-12-02.json"]  # later files replace earlier rows
KEY = "speedup_vs_torch.fa3"


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


rows = {}
for src in SOURCES:
    for r in json.loads((R / src).read_text())["rows"]:
        if r["impl"] == "jax.pallas_mosaic_gpu":
            rows[r["name"]] = dict(r, source=src)
host = [r[KEY] for r in rows.values()]
span = [r["span_" + KEY] for r in rows.values() if "span_" + KEY in r]
h128 = [r[KEY] for n, r in rows.items() if n.startswith("H128_")]
h16 = [r[KEY] for n, r in rows.items() if n.startswith("H16_")]
summary = {"shapes": len(host), "geomean_speedup": geomean(host), "span_shapes": len(span),
           "span_geomean_speedup": geomean(span), "h16_geomean": geomean(h16), "h128_geomean": geomean(h128),
           "min": min(host), "max": max(host)}
print(json.dumps(summary, indent=1))
out = {"what": __doc__.split("\n  python")[0], "sources": SOURCES, "summary": summary,
       "rows": [{k: r.get(k) for k in ("name", "source", "seconds", "TBps", "TFLOPps", KEY, "span_" + KEY)}
                for r in rows.values()]}
(R / "h200-bench-mosaic-grid-composite-2026-12-02.json").write_text(json.dumps(out, indent=1) + "\n")
