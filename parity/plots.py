"""PNG plots of parity reports and bench results.

matplotlib is an optional dependency (the `notebooks` extra); without it every function
here raises `MatplotlibMissing`, saying so. The functions take the JSON dicts that
`python -m parity --json` and `python -m parity bench --json` write, so the baselines
in benchmarks/ re-plot anywhere:

    python -m parity plot benchmarks/h200/mosaic.json --png roofline.png

Figures are built with `matplotlib.figure.Figure` (no pyplot, no global backend change),
so this is safe to call from a notebook, a test or a headless GPU machine.
"""

from __future__ import annotations

import io
import math
import reprlib
import sys

# The H200's anchor ceilings: a large device-to-device copy (bytes read + written) and an
# 8192^3 bf16 matmul, measured on this project's H200. Used when a bench JSON carries no
# ceilings of its own (a run with --no-ceilings, or one written before the bench measured them).
ANCHOR_CEILINGS = {"copy_TBps": 4.26, "matmul_TFLOPps": 788.0}
ANCHOR_SOURCE = "anchors' H200 numbers, not measured in this run"

DTYPE_COLORS = {"bfloat16": "tab:blue", "float16": "tab:orange", "float32": "tab:green"}
HEAD_MARKERS = {16: "o", 64: "s", 128: "^"}
OTHER_HEADS_MARKER = "D"


class MatplotlibMissing(ImportError):
    """matplotlib is not installed (it is optional: the `notebooks` extra)."""


def _figure_cls():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise MatplotlibMissing(
            "matplotlib is not installed, so no PNG can be drawn "
            "(pip install matplotlib, or the notebooks extra: pip install -e '.[notebooks]')"
        ) from e
    return Figure


_JSON_KINDS = {dict: "a JSON object", list: "a JSON list", str: "a JSON string", int: "a JSON number",
               float: "a JSON number", bool: "a JSON boolean", type(None): "JSON null"}


def json_kind(value) -> str:
    """What JSON calls the type of `value`, one of json.load's values ("a JSON number", "a JSON list", ...); the
    Python type's name for anything else."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def check_rows(results: dict) -> None:
    """ValueError, one line naming the entry, unless every entry of results["rows"] is an object and
    results["impls"], where present, is a non-empty list of names: the entries that `plot` and `merge` index.
    `results` is a dict with a "rows" list (report_kind and `merge` check that first, each in its own words)."""
    for i, row in enumerate(results["rows"]):
        if not isinstance(row, dict):
            raise ValueError(f"rows[{i}] must be an object, got rows[{i}]={reprlib.repr(row)} ({json_kind(row)})")
    if "impls" in results:
        impls = results["impls"]
        if not isinstance(impls, list) or not impls or not all(isinstance(name, str) for name in impls):
            raise ValueError(f"impls must be a non-empty list of names, got impls={reprlib.repr(impls)} "
                             f"({json_kind(impls)})")


def report_kind(results: dict) -> str:
    """"parity" (a `python -m parity --json` report) or "bench" (a `python -m parity bench
    --json` result); ValueError for anything else, or for rows or impls that `check_rows` refuses."""
    rows = results.get("rows") if isinstance(results, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError("not a parity or bench result: expected a JSON object with a non-empty 'rows' list")
    check_rows(results)
    if "scenario" in rows[0] and "against" in rows[0]:
        return "parity"
    if "shape" in rows[0] and "impl" in rows[0]:
        return "bench"
    raise ValueError(f"rows look like neither a parity report nor a bench result (keys {sorted(rows[0])[:8]})")


def ceilings(bench: dict) -> tuple[float, float, str]:
    """(copy TB/s, matmul TFLOP/s, source): the bench's own measurement when it has one
    (`copy_TBps`, `matmul_TFLOPps`, written by `measure_ceilings`), else the anchors'."""
    copy, mm = bench.get("copy_TBps"), bench.get("matmul_TFLOPps")
    if isinstance(copy, (int, float)) and isinstance(mm, (int, float)) and copy > 0 and mm > 0:
        return float(copy), float(mm), "measured in this run"
    return ANCHOR_CEILINGS["copy_TBps"], ANCHOR_CEILINGS["matmul_TFLOPps"], ANCHOR_SOURCE


def _impl_order(rows, preferred=()) -> list[str]:
    seen = [i for i in preferred if any(r.get("impl") == i for r in rows)]
    for r in rows:
        if r.get("impl") not in seen:
            seen.append(r.get("impl"))
    return seen


def _colors(names) -> dict[str, str]:
    return {n: f"C{i % 10}" for i, n in enumerate(names)}


# ----------------------------------------------------------------------------- bench


def timed_rows(bench: dict) -> list[dict]:
    return [r for r in bench.get("rows", []) if isinstance(r.get("seconds"), (int, float)) and r["seconds"] > 0]


def twin_ratios(bench: dict) -> list[tuple[str, str, str, float]]:
    """(shape name, dist, impl, time / time of its uniform twin) of every timed ragged row whose twin the same
    impl timed, in the order of the rows (the twin from `parity.bench.twin_name`: the row's `twin`, its shape, or its
    name)."""
    from parity.bench import row_dist, twin_name

    rows = timed_rows(bench)
    seconds = {(r["name"], r["impl"]): r["seconds"] for r in rows}
    out = []
    for r in rows:
        twin = twin_name(r)
        if twin is not None and (twin, r["impl"]) in seconds:
            out.append((r["name"], row_dist(r), r["impl"], r["seconds"] / seconds[(twin, r["impl"])]))
    return out


def roofline_figure(bench: dict):
    """Left: the roofline, TFLOP/s against arithmetic intensity (FLOPs / bytes), under the
    copy and matmul ceilings; one marker per (impl, shape). Right: achieved TB/s on the
    same x axis, under the copy ceiling. Markers: circle H=16, square H=64, triangle H=128
    (a diamond for other head counts); hollow q_len > 1. A ragged row has its uniform twin's
    bytes and FLOPs, so it sits at its twin's intensity. With ragged rows whose twins were
    timed, a third panel below: each one's time over its twin's (`twin_ratios`), grouped by
    distribution, against the 1.15 target."""
    Figure = _figure_cls()
    rows = timed_rows(bench)
    copy, mm, source = ceilings(bench)
    impls = _impl_order(rows, bench.get("impls") or ())
    color = _colors(impls)
    ragged = twin_ratios(bench)
    if ragged:
        fig = Figure(figsize=(11, 8.6), layout="constrained")
        gs = fig.add_gridspec(2, 2, height_ratios=(1.25, 1.0))
        ax_f, ax_b = fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1])
        _ragged_panel(fig.add_subplot(gs[1, :]), ragged, impls, color)
    else:
        fig = Figure(figsize=(11, 5.0), layout="constrained")
        ax_f, ax_b = fig.subplots(1, 2)
    ais = [r["flops"] / r["bytes"] for r in rows] or [1.0]
    ridge = mm / copy  # FLOP/byte where the two ceilings meet
    lo = min(min(ais), ridge) / 2
    hi = max(max(ais), ridge) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for impl in impls:
        mine = [r for r in rows if r["impl"] == impl]
        for filled in (True, False):
            for heads in sorted({r["shape"]["num_heads"] for r in mine}):
                pts = [r for r in mine if r["shape"]["num_heads"] == heads and (r["shape"].get("q_len", 1) == 1) == filled]
                if not pts:
                    continue
                x = [r["flops"] / r["bytes"] for r in pts]
                style = dict(marker=HEAD_MARKERS.get(heads, OTHER_HEADS_MARKER), s=22, linewidths=1,
                             edgecolors=color[impl], facecolors=color[impl] if filled else "none")
                ax_f.scatter(x, [r["TFLOPps"] for r in pts], **style)
                ax_b.scatter(x, [r["TBps"] for r in pts], **style)
        ax_f.scatter([], [], color=color[impl], label=f"{impl} ({len(mine)} shapes)")
    ax_f.plot(xs, [min(mm, copy * x) for x in xs], color="k", lw=1.5, label="roofline")
    ax_f.plot(xs, [copy * x for x in xs], color="gray", ls="--", lw=1, label=f"copy {copy:.2f} TB/s")
    ax_f.axhline(mm, color="gray", ls=":", lw=1, label=f"bf16 matmul {mm:.0f} TFLOP/s")
    ax_f.set_ylim(max(1e-3, min([r["TFLOPps"] for r in rows] or [1]) / 3), mm * 1.8)
    ax_b.plot(xs, [min(copy, mm / x) for x in xs], color="k", lw=1.5)
    ax_b.axhline(copy, color="gray", ls="--", lw=1)
    ax_b.set_ylim(max(1e-3, min([r["TBps"] for r in rows] or [1]) / 3), copy * 1.8)
    from matplotlib.ticker import NullFormatter

    for ax, unit in ((ax_f, "achieved TFLOP/s"), (ax_b, "achieved TB/s")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ticks = [m * 10**k for k in range(-2, 6) for m in (1, 2, 5) if lo <= m * 10**k <= hi]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlim(lo, hi)
        ax.set_xlabel("arithmetic intensity (FLOPs / byte)")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.25)
    for heads in sorted({r["shape"]["num_heads"] for r in rows}):
        ax_f.scatter([], [], marker=HEAD_MARKERS.get(heads, OTHER_HEADS_MARKER), color="gray", label=f"H={heads}")
    ax_f.scatter([], [], marker="o", facecolors="none", edgecolors="gray", label="q_len > 1 (hollow)")
    fig.legend(*ax_f.get_legend_handles_labels(), loc="outside lower center", ncol=5, fontsize=7)
    ax_f.set_title("roofline", fontsize=9)
    ax_b.set_title("memory bandwidth", fontsize=9)
    device = bench.get("device", "?")
    fig.suptitle(f"{device}, grid {bench.get('grid', '?')}: {len({r['name'] for r in rows})} shapes\n"
                 f"ceilings: copy {copy:.2f} TB/s, matmul {mm:.0f} TFLOP/s ({source})", fontsize=9)
    return fig


def _ragged_panel(ax, ragged, impls, color) -> None:
    """Each ragged row's time over its uniform twin's (`twin_ratios`), per impl, the shapes grouped by distribution
    (in `parity.shapes.DISTRIBUTIONS` order), against 1 and the 1.15 target."""
    from parity.bench import TWIN_TARGET
    from parity.shapes import DISTRIBUTIONS

    dist_of = {n: d for n, d, _, _ in ragged}
    groups = sorted(set(dist_of.values()), key=lambda d: (DISTRIBUTIONS.index(d) if d in DISTRIBUTIONS else 99, d))
    names = [n for d in groups for n in dict.fromkeys(n for n, _, _, _ in ragged if dist_of[n] == d)]
    pos = {n: i for i, n in enumerate(names)}
    mine = [i for i in impls if any(impl == i for _, _, impl, _ in ragged)]
    for k, impl in enumerate(mine):
        pts = [(n, v) for n, _, i, v in ragged if i == impl]
        shift = (k - (len(mine) - 1) / 2) * 0.12
        gm = geomean(v for _, v in pts)
        ax.plot([pos[n] + shift for n, _ in pts], [v for _, v in pts], "o", ms=4, color=color[impl],
                label=f"{impl}: geomean {gm:.3f}, max {max(v for _, v in pts):.2f}")
    ax.axhline(1.0, color="k", lw=1)
    ax.axhline(TWIN_TARGET, color="tab:red", ls="--", lw=1, label=f"target {TWIN_TARGET}")
    first = 0
    for d in groups:
        count = sum(dist_of[n] == d for n in names)
        ax.text(first + (count - 1) / 2, 1.0, d, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                fontsize=8)
        if first:
            ax.axvline(first - 0.5, color="gray", lw=0.8, ls=":")
        first += count
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=5 if len(names) > 20 else 7)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel("ragged time / uniform twin time")
    ax.grid(True, axis="y", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"ragged batches against uniform ones of the same total KV tokens (<= {TWIN_TARGET}: within the "
                 "target)", fontsize=9, pad=14)


def speed_ratios(bench: dict, against: str) -> dict[str, list[tuple[str, float]]]:
    """Per impl (other than `against`): [(shape name, time of `against` / time of impl)] over
    the shapes where both were timed, in the order of the rows (> 1: faster than `against`)."""
    rows = timed_rows(bench)
    base = {r["name"]: r["seconds"] for r in rows if r["impl"] == against}
    out: dict[str, list[tuple[str, float]]] = {}
    for r in rows:
        if r["impl"] != against and r["name"] in base:
            out.setdefault(r["impl"], []).append((r["name"], base[r["name"]] / r["seconds"]))
    return out


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def speedup_figure(bench: dict, against=("torch.fa3", "torch.flashmla")):
    """One panel per baseline in `against` that the bench timed: per shape, the baseline's
    time over each other impl's (> 1: the impl is faster), with each impl's geomean."""
    Figure = _figure_cls()
    bases = [a for a in against if speed_ratios(bench, a)]
    if not bases:
        raise ValueError(f"none of {list(against)} was timed in this bench next to another impl")
    impls = _impl_order(timed_rows(bench), bench.get("impls") or ())
    color = _colors(impls)
    fig = Figure(figsize=(11, 3.2 * len(bases)), layout="constrained")
    axes = fig.subplots(len(bases), 1, squeeze=False)[:, 0]
    for ax, base in zip(axes, bases):
        ratios = speed_ratios(bench, base)
        names = []
        for pts in ratios.values():
            names += [n for n, _ in pts if n not in names]
        pos = {n: i for i, n in enumerate(names)}
        for impl, pts in ratios.items():
            gm = geomean(v for _, v in pts)
            ax.plot([pos[n] for n, _ in pts], [v for _, v in pts], "o", ms=3.5, color=color[impl],
                    label=f"{impl}: geomean {gm:.3f}")
            ax.axhline(gm, color=color[impl], lw=0.8, ls="--")
        ax.axhline(1.0, color="k", lw=1)
        ax.set_ylabel(f"{base} time / impl time")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=90, fontsize=5 if len(names) > 20 else 7)
        ax.set_xlim(-0.5, len(names) - 0.5)
        ax.grid(True, axis="y", alpha=0.25)
        ax.legend(fontsize=7, loc="upper left")
        ax.set_title(f"against {base} (> 1: faster than {base})", fontsize=9)
    fig.suptitle(f"{bench.get('device', '?')}, grid {bench.get('grid', '?')}", fontsize=9)
    return fig


# ----------------------------------------------------------------------------- parity


def error_figure(report: dict):
    """Per compared pair (impl vs the reference, or a Pallas kernel / FlashMLA vs FA3): the out
    relative error and the lse max abs error of every scenario (one point each, coloured by
    dtype, over a box per pair), log scale, with the harness tolerance of each dtype dashed.
    Exact agreement (0) sits on the bottom edge, NaN/Inf mismatches on the top edge (x)."""
    from parity.compare import TOLERANCES

    Figure = _figure_cls()
    rows = [r for r in report["rows"] if r.get("out") and r.get("lse")]
    pairs: list[tuple[str, str]] = []
    for r in rows:
        if (r["impl"], r["against"]) not in pairs:
            pairs.append((r["impl"], r["against"]))
    scenarios = sorted({r["scenario"] for r in rows})
    dtypes = [d for d in DTYPE_COLORS if any(r["dtype"] == d for r in rows)]
    dtypes += sorted({r["dtype"] for r in rows} - set(dtypes))
    slots = [(s, d) for s in scenarios for d in dtypes]  # one x offset per (scenario, dtype)
    jitter = {k: (i - (len(slots) - 1) / 2) / max(len(slots), 1) * 0.7 for i, k in enumerate(slots)}
    fig = Figure(figsize=(max(7.0, 1.3 * len(pairs) + 4.5), 7.4), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    panels = (("out", "rel_err", "out_rel", "out: relative error ||a - b|| / ||b||"),
              ("lse", "max_abs_err", "lse_abs", "lse: max abs error (natural log units)"))
    for ax, (part, key, tol_key, title) in zip(axes, panels):
        finite = [r[part][key] for r in rows if math.isfinite(r[part][key]) and r[part][key] > 0]
        tols = [TOLERANCES[d][tol_key] for d in dtypes if d in TOLERANCES]
        floor = max(min(finite + tols) / 8, 1e-12)  # where exact (0) errors are drawn
        top = max(finite + tols) * 8  # NaN/Inf mismatches are drawn at top / 2
        boxes = []
        for pair in pairs:
            vals = [r[part][key] for r in rows if (r["impl"], r["against"]) == pair]
            boxes.append([v for v in vals if math.isfinite(v) and v > 0] or [floor])
        ax.boxplot(boxes, positions=list(range(len(pairs))), widths=0.75, showfliers=False, patch_artist=True,
                   boxprops=dict(facecolor="0.93", edgecolor="0.6"), medianprops=dict(color="0.4"),
                   whiskerprops=dict(color="0.6"), capprops=dict(color="0.6"))
        for i, pair in enumerate(pairs):
            for r in rows:
                if (r["impl"], r["against"]) != pair:
                    continue
                v = r[part][key]
                x = i + jitter[(r["scenario"], r["dtype"])]
                c = DTYPE_COLORS.get(r["dtype"], "gray")
                edge = "red" if r["status"] == "FAIL" else "none"
                if not math.isfinite(v):
                    ax.scatter([x], [top / 2], marker="x", color="red" if r["status"] == "FAIL" else c, s=30,
                               zorder=3)
                elif v <= 0:
                    ax.scatter([x], [floor], marker="v", color=c, s=18, zorder=3, edgecolors=edge)
                else:
                    ax.scatter([x], [v], marker="o", s=16, zorder=3, color=c, edgecolors=edge, linewidths=1.5)
        by_tol: dict[float, list[str]] = {}
        for d in dtypes:
            if d in TOLERANCES:
                by_tol.setdefault(TOLERANCES[d][tol_key], []).append(d)
        for tol, ds in by_tol.items():
            ax.axhline(tol, color=DTYPE_COLORS.get(ds[0], "k") if len(ds) == 1 else "k", ls="--", lw=1,
                       label=f"{'/'.join(ds)} tolerance {tol:.0e}")
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, top)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.25)
        for d in dtypes:
            ax.scatter([], [], color=DTYPE_COLORS.get(d, "gray"), s=16, label=d)
        ax.scatter([], [], marker="v", color="gray", s=18, label="0 (bitwise equal), drawn at the bottom")
        ax.scatter([], [], marker="x", color="gray", s=30, label="NaN/Inf positions differ, drawn at the top")
        ax.scatter([], [], marker="o", color="white", edgecolors="red", linewidths=1.5, s=16,
                   label="red: the row FAILED")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[1].set_xticks(range(len(pairs)))
    axes[1].set_xticklabels([f"{a}\nvs {b}" for a, b in pairs], fontsize=7, rotation=20, ha="right")
    counts = {}
    for r in report["rows"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    env = report.get("environment", {})
    fig.suptitle(f"parity on {env.get('device', '?')} (jax on {env.get('jax_backend', '?')}): "
                 + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                 + f"; one point per scenario and dtype ({len(scenarios)} scenarios)", fontsize=9)
    return fig


# ----------------------------------------------------------------------------- files


def png_bytes(fig, dpi: int = 80) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def write_png(results: dict, path, dpi: int = 110) -> str:
    """Draws a parity report (error distributions) or a bench result (roofline) to `path`;
    returns what was drawn, in words."""
    kind = report_kind(results)
    if kind == "parity":
        fig = error_figure(results)
        what = "error distributions"
    else:
        fig = roofline_figure(results)
        what = f"roofline; ceilings {ceilings(results)[2]}"
    fig.savefig(path, format="png", dpi=dpi)
    return what


def write_png_or_say_why(results: dict, path) -> bool:
    """`write_png`, saying on stdout what was written, or on stderr why nothing was (matplotlib
    missing: the command's JSON still holds every number). Returns whether a PNG was written."""
    try:
        what = write_png(results, path)
    except MatplotlibMissing as e:
        print(f"no PNG written to {path}: {e}. The numbers are in the JSON (--json).", file=sys.stderr)
        return False
    print(f"wrote {path} ({what})")
    return True
