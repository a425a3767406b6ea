"""Session 13 (CPU): the KV bytes each implementation would read if every 64-row head tile read its request's KV from
HBM, per second: (head tiles x KV bytes) / time, for the H >= 64 rows of a bench JSON (default: session 13's
composite grid). Above the copy ceiling (4.16-4.25 TB/s measured on this H200), some repeated reads hit L2.
  python parity/sessions/2026-12-02-s13-kv-reads.py [parity/results/<bench>.json]"""
import json
import math
import pathlib
import sys

R = pathlib.Path(__file__).resolve().parents[1] / "results"
path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else R / "h200-bench-mosaic-grid-composite-2026-12-02.json"
rows = [r for r in json.loads(path.read_text())["rows"] if "seconds" in r and r["shape"]["num_heads"] >= 64]
print(f"{'shape':22} {'impl':22} {'us':>8} {'tiles':>5} {'tiles x KV / t':>15} {'KV / t':>7}")
for r in rows:
    s = r["shape"]
    tiles = math.ceil(s["num_heads"] * s["q_len"] / 64)
    kv = s["batch"] * s["seq_len"] * 576 * 2
    print(f"{r['name']:22} {r['impl']:22} {r['seconds'] * 1e6:8.1f} {tiles:5d} {tiles * kv / r['seconds'] / 1e12:11.2f} TB/s "
          f"{kv / r['seconds'] / 1e12:7.2f}")
