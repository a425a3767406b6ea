"""Session 14 (CPU): issue #5's 61-shape grid on today's defaults (the heuristic picks heads_fastest at H = 128), composed
from committed runs, each shape's FA3 and Mosaic rows taken together from one run: the 31 H = 128 rows of session 14
(calls E and F), the 25 H = 16 rows of session 13 (q_len 1, q_len 2 at S <= 4096) and the 5 H = 16 q_len 2 S = 16384
rows of session 12 (no --trace: no span). Writes a bench-format JSON (grid "mosaic", its summary recomputed by
parity.bench.summary, each row with its `source`): parity/results/h200-bench-mosaic-grid-composite-s14-2026-12-02.json.
  python parity/sessions/2026-12-02-s14-composite.py"""
import json
import pathlib

from parity import bench

R = pathlib.Path(__file__).resolve().parents[1] / "results"
SOURCES = ["h200-bench-mosaic-grid-v8-trace-2026-12-01.json", "h200-bench-h16-q2-s16384-tpv-2026-12-02.json",
           "h200-bench-mosaic-grid-h16-s13-2026-12-02.json", "h200-bench-mosaic-grid-h128-s14-2026-12-02.json",
           "h200-bench-mosaic-grid-h128-rest-s14-2026-12-02.json"]  # a later file's shapes replace an earlier one's
IMPLS = ["torch.fa3", "jax.pallas_mosaic_gpu"]

by_shape = {}
for src in SOURCES:
    data = json.loads((R / src).read_text())
    assert data["impls"] == IMPLS, (src, data["impls"])
    for name in {r["name"] for r in data["rows"]}:
        by_shape[name] = [dict(r, source=src) for r in data["rows"] if r["name"] == name]
order = {s.name: k for k, s in enumerate(bench.GRIDS["mosaic"])}
assert set(by_shape) == set(order), sorted(set(order) ^ set(by_shape))
rows = [r for name in sorted(by_shape, key=order.get) for r in by_shape[name]]
text, summary = bench.summary(rows, IMPLS)
print(text)
out = {"grid": "mosaic", "composite_of": SOURCES, "what": __doc__.split("\n  python")[0], "impls": IMPLS,
       "device": "NVIDIA H200", "complete": True, "summary": summary, "rows": rows}
(R / "h200-bench-mosaic-grid-composite-s14-2026-12-02.json").write_text(json.dumps(out, indent=1) + "\n")
