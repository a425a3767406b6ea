"""Session 14: the GPU's SM clock, power and throttle reasons (nvidia-smi every 100 ms, the calls' clocks.csv)
during each bench row's timed launches (its timed_from / timed_to, unix seconds).

    python parity/sessions/2026-12-02-s14-clocks.py BENCH.json CLOCKS.csv
"""
import csv
import datetime
import json
import statistics
import sys


def samples(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    out = []
    for r in rows[1:]:
        if len(r) < 6 or "MHz" not in r[1]:
            continue
        t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
        out.append((t.timestamp(), float(r[1].split()[0]), float(r[3].split()[0]), int(r[4]), int(r[5].strip(), 16)))
    return out


def main(bench_path, clocks_path):
    bench = json.load(open(bench_path))
    smi = samples(clocks_path)
    print(f"{'shape':22s} {'impl':28s} {'us':>8s} {'n':>4s} {'SM MHz':>14s} {'W':>12s} {'C':>3s} reasons")
    for row in bench["rows"]:
        if "timed_from" not in row:
            continue
        win = [s for s in smi if row["timed_from"] <= s[0] <= row["timed_to"]]
        if not win:
            print(f"{row['name']:22s} {row['impl']:28s} (no samples in the window)")
            continue
        mhz = [s[1] for s in win]
        w = [s[2] for s in win]
        reasons = sorted({hex(s[4]) for s in win})
        print(f"{row['name']:22s} {row['impl']:28s} {row['seconds'] * 1e6:8.1f} {len(win):4d} "
              f"{statistics.mean(mhz):6.0f} ({min(mhz):4.0f}) {statistics.mean(w):5.0f} ({max(w):4.0f}) "
              f"{max(s[3] for s in win):3d} {','.join(reasons)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
