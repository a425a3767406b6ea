"""python -m parity bench: implementations timed side by side, in one process, on named grids of (num_heads, batch,
seq_len, q_len) at page_size 64 (`parity.shapes`), with the method of `parity.timing`: N back-to-back calls per
launch (a CUDA graph for torch, one jitted loop for JAX), the median of several launches divided by N.

With --trace each row also gets the device's view of one N-call launch (`parity.timing.trace_launch`):
`span_seconds`, from the first kernel's start to the last one's end, and `busy_seconds`, the kernels' summed time,
per call, and per launch `launch_lead_seconds` / `launch_tail_seconds`, the host-side time before the first kernel
starts and after the last one ends; the summary adds the geomean of the span ratios (no host time in it, while the
gaps between a loop's kernels count). With --slope each row also gets `seconds_slope`, (t(2N) - t(N)) / N from
launches of N and 2N calls, which drops what a launch costs once (on the H200 the JAX loop's launches carry 0.1-0.7
ms outside their kernels' device span, varying from launch to launch); its noise is that jitter / N, so it is a
diagnostic, not the ratio's number. With --cooldown S the GPU idles S seconds before each row's timed launches, so
every impl starts them from the same state rather than right after the impl before it (on the H200 the fp8 Mosaic
kernel, whose conversion keeps the SMs busy, times about 1.16x slower right after FA3's timing than after 3 s idle);
rows are timed in --impls order, so without it a later impl inherits the earlier ones' heat.

Bytes = KV read once (sum of seq_lens x 576 x 2) + q + out; FLOPs = 2 x H x q_len x sum of seq_lens x (576 + 512)
(the causal savings of q_len > 1 are not subtracted, as for the FA3 anchors). An fp8 row (`*.fp8`, opted into with
--impls) counts its KV at 1 byte per element (q and out stay bf16), and its TB/s comes from those bytes (the row's own
`bytes`, which the roofline uses).

FP8 (`jax.pallas_triton.fp8`, `jax.pallas_mosaic_gpu.fp8`): the same bf16 inputs, the cache quantized once per
shape to float8_e4m3fn with one float32 scale k_scale = amax(|kv|) / 448 (vLLM's convention: real value = fp8 value
x k_scale; `parity.timing.quantize_fp8`), timed with k_scale traced. With --check its out/lse gap to the first bf16
impl is recorded (`out_rel_vs_first`, `lse_abs_vs_first`, `fp8_gap: true`), not judged: fp8 is not expected to
match bf16 within bf16's tolerance, so it sets no `check_ok`. The summary adds `fp8_speedup_vs_bf16`: the geomean
of time(jax.pallas_triton) / time(the fp8 row) over the shapes where both were timed (`mosaic_fp8_speedup_vs_bf16`
likewise for the Mosaic kernel).

Ragged rows (the `ragged` grid; `parity.shapes` defines the distributions of their KV lengths): each row of a ragged
shape records its uniform twin's name (`twin`: the same heads, batch, q_len and total KV tokens, every request as
long) and, where the twin was timed by the same impl, `time_vs_twin` = its time / the twin's time (<= 1.15: within the
target, TWIN_TARGET, of 15% over a uniform batch of the same total KV tokens). The summary adds, per impl, the
geomean, min and max of those ratios, overall and per distribution, how many are within 1.15, and the geomean / min /
max speedup against the first impl over the ragged rows alone.

Sparse rows (the `sparse` grid; `parity.shapes.SparseShape`): the sparse decode of DeepSeek-V3.2, each token reading
topk scattered rows of its request's cache. `torch.fa3` is vLLM's FA3 path over one-token pages on the bf16 cache,
`torch.flashmla` FlashMLA's sparse fp8 decode on the fp8_ds_mla layout (it takes no other), the `jax.*` rows
mla_jax.sparse_mla_decode's kernels (`.fp8`: the fp8_ds_mla layout). Bytes = the selected rows (num_tokens x topk x
1152, or 656 in the fp8 layout) + the indices + q + out; FLOPs = 2 x H x num_tokens x topk x (576 + 512).

Ceilings (`parity.timing.measure_ceilings`, before the shapes, unless --no-ceilings): the machine's copy and bf16
matmul rates, stored in the JSON as copy_TBps and matmul_TFLOPps; the roofline (`--png`, parity/plots.py) is drawn
under them.

--save writes the result as the baseline of its grid on this GPU kind: benchmarks/<gpu>/<grid>.json and .png
(<gpu> from the device's name: h100, h200), replacing what is there; history is git's.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import re
import sys
import time

from parity import timing
from parity.shapes import DISTRIBUTIONS, GRIDS, Shape, SparseShape, grid_shapes, parse_shape

DEFAULT_IMPLS = ["torch.fa3", "torch.flashmla", "jax.pallas_triton", "jax.pallas_mosaic_gpu"]

FP8_IMPLS = {"jax.pallas_triton.fp8", "jax.pallas_mosaic_gpu.fp8"}
"""Impls that read an fp8 copy of the bf16 cache: 1-byte KV in their bytes, a recorded gap under --check."""

SPARSE_FP8_IMPLS = FP8_IMPLS | {"torch.flashmla"}
"""On a sparse shape, the impls that read the fp8_ds_mla copy of the cache (FlashMLA's sparse decode takes only that
layout): 656 bytes a key."""


def is_fp8(shape, impl: str) -> bool:
    """Whether `impl` reads an fp8 copy of the cache on `shape`."""
    return impl in (SPARSE_FP8_IMPLS if isinstance(shape, SparseShape) else FP8_IMPLS)


def arg_type(parse):
    """An argparse `type=` from a parser that raises ValueError: its message becomes an ArgumentTypeError, which
    argparse prints after the option's name ("argument --cooldown: cooldown must be ..."), where a plain
    ValueError would print only "invalid parse_cooldown value"."""

    @functools.wraps(parse)
    def typed(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return typed


def csv_names(text: str) -> list[str]:
    """A comma-separated list of names (empty items dropped); no name at all (``,`` or ``""``) is refused, not
    read as "the default"."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of names, got {text!r}")
    return names


def _int(text: str, least: int, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if n < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return n


def positive_int(text: str) -> int:
    """A count such as --reps: an integer >= 1."""
    return _int(text, 1, "an integer >= 1")


def nonnegative_int(text: str) -> int:
    """A seed: an integer >= 0 (NumPy's generators refuse negative seeds)."""
    return _int(text, 0, "an integer >= 0")


def check_output_path(path: str) -> str | None:
    """Why `path` cannot be written (its folder missing or not writable, or it is a folder or a special file such
    as /dev/full), or None: checked before a run, so that a typo fails at once rather than after the run, with its
    results lost."""
    if not path:
        return "an empty path"
    if os.path.isdir(path):
        return "it is a directory"
    if os.path.exists(path) and not os.path.isfile(path):
        return "it is not a regular file (a device, a pipe or a socket)"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"its directory {parent!r} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {parent!r} is not writable"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "it is not writable"
    return None


BASELINE_DIR = "benchmarks"
"""Where --save writes: <dir>/<gpu kind>/<grid>.json and .png, the current baseline of each grid on each GPU kind."""


def gpu_kind(device_name: str) -> str:
    """The folder of a GPU's baseline: its model from the device's name, lower case ("NVIDIA H100 80GB HBM3" ->
    "h100", "NVIDIA H200" -> "h200"); a name without one, the whole name made a folder name."""
    m = re.search(r"\b([A-Za-z]+\d+[A-Za-z]*)\b", device_name.replace("NVIDIA", ""))
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "gpu"


def baseline_paths(save_dir: str, device_name: str, grid: str) -> tuple[str, str]:
    """(json, png) that --save writes for `grid` on the device named `device_name`."""
    folder = os.path.join(save_dir, gpu_kind(device_name))
    return os.path.join(folder, f"{grid}.json"), os.path.join(folder, f"{grid}.png")


def write_json(result: dict, path: str) -> None:
    """`result` written to `path` whole or not at all (a temporary file beside it, then renamed)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def add_arguments(p):
    p.add_argument("--grid", default="headline", choices=sorted(GRIDS), help="named grid (default: headline)")
    p.add_argument("--impls", type=csv_names, default=None,
                   help=f"comma-separated (default: {','.join(DEFAULT_IMPLS)}); those that cannot run here are "
                        "left out, saying why; the first that runs is the ratio's baseline")
    p.add_argument("--reps", type=positive_int, default=7, help="timed launches per shape (median taken; >= 1)")
    p.add_argument("--check", action="store_true", help="also compare each impl's out/lse with the first impl")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--png", help="draw the roofline here (needs matplotlib)")
    p.add_argument("--save", nargs="?", const=BASELINE_DIR, default=None, metavar="DIR",
                   help=f"write the result as this GPU kind's baseline of the grid: DIR/<gpu>/<grid>.json and .png "
                        f"(DIR default {BASELINE_DIR}, relative to the current directory; <gpu> from the device's "
                        "name, e.g. h100, h200), replacing them; the whole grid only (not with --shard or --shapes)")
    p.add_argument("--shard", type=arg_type(parse_shard), default=None, metavar="I/N",
                   help="time only shapes I, I+N, I+2N, ... of the grid (0 <= I < N), e.g. one half per GPU; "
                        "`python -m parity merge` joins the shards' JSONs")
    p.add_argument("--shapes", type=csv_names, default=None,
                   help="time only these shapes of the grid, comma-separated names such as H16_B64_S1024_q2 "
                        "(each must be in the grid; with --shard, those of the shard)")
    p.add_argument("--trace", action="store_true",
                   help="also time each row on the device: one N-call launch traced with the JAX profiler "
                        "(parity.timing.trace_launch), its kernels' span and busy time per call; the summary adds the "
                        "geomean of the span ratios")
    p.add_argument("--slope", action="store_true",
                   help="also time launches of 2N calls: seconds_slope = (t(2N) - t(N)) / N per row (a diagnostic)")
    p.add_argument("--launch-ms", type=arg_type(parse_launch_ms), default=timing.LAUNCH_SECONDS * 1e3,
                   help="what one timed launch of N calls lasts, N chosen per shape "
                        f"(default {timing.LAUNCH_SECONDS * 1e3:g})")
    p.add_argument("--cooldown", type=arg_type(parse_cooldown), default=0.0, metavar="S",
                   help="idle S seconds before each row's timed launches, so that no impl is timed right after "
                        "another one's (default 0: timed back to back)")
    p.add_argument("--no-ceilings", action="store_true",
                   help="do not measure the copy/matmul ceilings (the roofline then uses the anchors' numbers)")


def parse_launch_ms(text: str) -> float:
    """--launch-ms: a finite number of milliseconds > 0 (calibration divides it by a call's time and rounds up to
    a count of calls, which an infinite one has not)."""
    try:
        ms = float(text)
    except ValueError:
        ms = math.nan
    if not 0 < ms < math.inf:
        raise ValueError(f"launch-ms must be a finite positive number of milliseconds, got launch_ms={text!r}")
    return ms


def parse_cooldown(text: str) -> float:
    """--cooldown: a finite number of seconds >= 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise ValueError(f"cooldown must be a number of seconds >= 0, got cooldown={text!r}")
    return seconds


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"shard must be I/N with integers, got shard={text!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"shard I/N needs 0 <= I < N, got shard={text!r}")
    return i, n

def merge(results: list, sources: list[str] | None = None) -> dict:
    """Joins bench JSONs of shards of one grid (same impls; rows concatenated, in grid order) and
    recomputes the ragged rows' `time_vs_twin` and the summary over all rows. complete: every shard finished and
    every shape is there. `sources` (the files they were read from) name the results in errors; `results[i]`
    without. Each result must be a JSON object with a 'rows' list that passes plots.check_rows, the check that
    `plot` makes."""
    from parity import plots

    if not results:
        raise ValueError("merge needs at least one bench result")
    for i, r in enumerate(results):
        name = sources[i] if sources is not None else f"results[{i}]"
        if not isinstance(r, dict) or not isinstance(r.get("rows"), list):
            got = "an object without a 'rows' list" if isinstance(r, dict) else plots.json_kind(r)
            raise ValueError(f"{name} is not a bench result (a JSON object with a 'rows' list), got {got}")
        try:
            plots.check_rows(r)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    first = results[0]
    for r in results[1:]:
        for key in ("grid", "impls", "xla_flags", "launch_ms", "cooldown_s"):
            if r.get(key) != first.get(key):
                raise ValueError(f"cannot merge results of different {key}: {first.get(key)!r} vs {r.get(key)!r}")
    grid = first.get("grid")
    if not isinstance(grid, str) or grid not in GRIDS:
        raise ValueError(f"grid must be one of the bench's grids ({', '.join(GRIDS)}), got grid={grid!r}")
    order = {shape.name: k for k, shape in enumerate(GRIDS[grid])}
    rows = sorted((dict(row) for r in results for row in r["rows"]),
                  key=lambda row: order.get(row["name"], len(order)))
    names = {row["name"] for row in rows}
    add_twin_ratios(rows)  # a shard's ragged row and its twin may have been timed apart
    _, summ = summary(rows, first["impls"])
    merged = {k: v for k, v in first.items() if k not in ("rows", "summary", "shard", "shapes")}
    merged.update(rows=rows, summary=summ, shards=[r.get("shard") for r in results],
                  complete=all(r.get("complete") for r in results) and names >= set(order),
                  unavailable={k: v for r in results for k, v in r.get("unavailable", {}).items()})
    return merged


def unavailable_reason(impl: str) -> str | None:
    """Why `impl` cannot be timed on this machine at all (None: it can; a shape it does not
    take is reported per row instead)."""
    if impl == "torch.fa3":
        from mla_torch import fa3

        return fa3.fa3_unavailable_reason()
    if impl == "torch.flashmla":
        from parity import runner

        try:
            runner.flashmla_interface()
        except ImportError as e:
            return str(e)
        return None
    if impl.startswith("jax."):
        import jax

        if jax.default_backend() != "gpu":
            return f"JAX has no GPU here (default backend {jax.default_backend()!r})"
    return None


def row_bytes(shape: Shape, impl: str) -> int:
    """The bytes of one row: Shape.bytes, with the KV at 1 byte per element for an fp8 impl (a sparse shape's: the
    fp8_ds_mla layout's 656 bytes a key)."""
    return shape.bytes(kv_itemsize=1 if is_fp8(shape, impl) else None)


def run_bench(shapes, impls, reps=7, check=False, log=print, checkpoint=None, progress=None, trace=False,
              slope=False, launch_seconds=timing.LAUNCH_SECONDS, cooldown_s=0.0):
    import torch

    from parity.compare import compare_out_lse
    from parity.runner import _to_np

    rows = []
    for shape in shapes:
        inp = timing.make_inputs(shape)
        base = None  # the first bf16 impl's (out, lse): what --check compares the others with
        for name in impls:
            if progress:
                progress(f"{shape.name} {name}")
            fp8 = is_fp8(shape, name)
            nbytes = row_bytes(shape, name)
            row = {"shape": dataclasses.asdict(shape), "name": shape.name, "impl": name,
                   "kv_tokens": shape.kv_tokens, "bytes": nbytes, "flops": shape.flops()}
            if shape.ragged:
                row.update(twin=shape.uniform_twin().name, max_seq_len=shape.max_seq_len)
            if fp8:
                row["kv_cache_dtype"] = "fp8_ds_mla" if isinstance(shape, SparseShape) else "fp8_e4m3"
            try:
                timer, (out, lse) = timing.calibrate(timing.RUNNERS[name], inp, slope=slope, launch_seconds=launch_seconds)
                if cooldown_s:  # the timed launches start from an idle GPU, not from the last impl's heat
                    time.sleep(cooldown_s)
                timed_from = time.time()
                sec, sec_slope = timer.measure(reps)
                # (wall-clock bounds of the timed launches: to line a row up with a GPU clock log, e.g. nvidia-smi's)
                row.update(seconds=sec, n_calls=timer.n, TBps=nbytes / sec / 1e12, TFLOPps=shape.flops() / sec / 1e12,
                           timed_from=timed_from, timed_to=time.time())
                if slope:
                    row["seconds_slope"] = sec_slope
                if trace:
                    events, window = timing.trace_launch(timer.short)
                    t = timing.summarize(events, timer.n, window)
                    if t["kernels"]:
                        row.update(span_seconds=t["span_us"] * 1e-6, busy_seconds=t["busy_us"] * 1e-6)
                    if "lead_us" in t:  # per launch: host time before the first kernel and after the last
                        row.update(launch_lead_seconds=t["lead_us"] * 1e-6, launch_tail_seconds=t["tail_us"] * 1e-6)
                if check:
                    o, l = _to_np(out), _to_np(lse)
                    if base is None and not fp8:
                        base = (o, l)
                    elif base is not None:
                        c_out, c_lse = compare_out_lse(o, l, *base, shape.dtype)
                        row.update(out_rel_vs_first=c_out.rel_err, lse_abs_vs_first=c_lse.max_abs_err)
                        if fp8:  # a measured gap, not judged against bf16's tolerance
                            row.update(fp8_gap=True, out_cos_vs_first=c_out.cos_sim)
                        else:
                            row.update(check_ok=bool(c_out.ok and c_lse.ok))
            except Exception as e:  # reported per row; the bench goes on
                row.update(error=f"{type(e).__name__}: {e}"[:400])
            rows.append(row)
            log(_fmt_row(row))
        del inp
        torch.cuda.empty_cache()
        if checkpoint:
            checkpoint(rows)
    # ratio to the first impl (baseline) per shape
    by_shape = {}
    for r in rows:
        by_shape.setdefault(r["name"], {})[r["impl"]] = r
    for r in rows:
        b = by_shape[r["name"]].get(impls[0], {})
        if "seconds" in r and "seconds" in b:
            r["speedup_vs_" + impls[0]] = b["seconds"] / r["seconds"]
        if "span_seconds" in r and "span_seconds" in b:
            r["span_speedup_vs_" + impls[0]] = b["span_seconds"] / r["span_seconds"]
    add_twin_ratios(rows)
    return rows


TWIN_TARGET = 1.15
"""The target for a ragged batch: its time within 15% of its uniform twin's (same total KV tokens)."""


def twin_name(row: dict) -> str | None:
    """The name of a ragged row's uniform twin (the row's `twin`, else from its shape dict or its name); None for
    a uniform row, or a name that is no shape's."""
    if row.get("twin"):
        return row["twin"]
    shape = row.get("shape")
    try:
        if isinstance(shape, dict) and "num_heads" in shape:
            s = Shape(**shape)
        else:
            s = parse_shape(row.get("name", ""))
    except (TypeError, ValueError):
        return None
    return s.uniform_twin().name if s.ragged else None


def row_dist(row: dict) -> str:
    """The distribution of a row's KV lengths: its shape dict's `dist` (uniform in a row written before shapes had
    one), else its name's."""
    shape = row.get("shape")
    if isinstance(shape, dict) and "num_heads" in shape:
        return shape.get("dist", "uniform")
    try:
        return parse_shape(row.get("name", "")).dist
    except ValueError:
        return "uniform"


def add_twin_ratios(rows) -> None:
    """Sets `time_vs_twin` (its seconds / its uniform twin's, the same impl's) on every timed ragged row whose
    twin is timed among `rows`; clears it elsewhere (a merge recomputes it over all the shards' rows)."""
    seconds = {(r["name"], r["impl"]): r["seconds"] for r in rows if "seconds" in r}
    for r in rows:
        r.pop("time_vs_twin", None)
        twin = twin_name(r)
        if twin is not None and "seconds" in r and (twin, r["impl"]) in seconds:
            r["time_vs_twin"] = r["seconds"] / seconds[(twin, r["impl"])]


def _fmt_row(r):
    if "error" in r:
        return f"{r['name']:<28} {r['impl']:<22} ERROR {r['error'][:120]}"
    extra = ""
    if "check_ok" in r:
        extra = f"  check {'ok' if r['check_ok'] else 'FAIL'} (out {r['out_rel_vs_first']:.1e}, lse {r['lse_abs_vs_first']:.1e})"
    elif r.get("fp8_gap"):
        extra = f"  fp8 gap vs first (out rel {r['out_rel_vs_first']:.1e}, lse abs {r['lse_abs_vs_first']:.1e})"
    span = f"  span {r['span_seconds'] * 1e6:.1f} us" if "span_seconds" in r else ""
    return (f"{r['name']:<28} {r['impl']:<22} {r['seconds'] * 1e6:>9.1f} us {r['TBps']:>6.2f} TB/s "
            f"{r['TFLOPps']:>6.1f} TFLOP/s  (N={r['n_calls']}){span}{extra}")


def summary(rows, impls):
    from parity import plots  # its geomean (matplotlib is imported only to draw)

    base = impls[0]
    key = "speedup_vs_" + base
    lines = [f"{'impl':<22} {'shapes':>6} {'geomean ' + base + '/impl':>28} {'min':>6} {'max':>6}"]
    out = {}
    for name in impls[1:]:
        ratios = [r[key] for r in rows if r["impl"] == name and key in r]
        if not ratios:
            lines.append(f"{name:<22} {0:>6} {'-':>28}")
            continue
        gm = plots.geomean(ratios)
        out[name] = {"shapes": len(ratios), "geomean_speedup": gm, "min": min(ratios), "max": max(ratios)}
        lines.append(f"{name:<22} {len(ratios):>6} {gm:>28.3f} {min(ratios):>6.2f} {max(ratios):>6.2f}")
    span_key = "span_" + key
    for name in impls[1:]:
        ratios = [r[span_key] for r in rows if r["impl"] == name and span_key in r]
        if ratios:
            gm = plots.geomean(ratios)
            out.setdefault(name, {}).update(span_shapes=len(ratios), span_geomean_speedup=gm,
                                            span_min=min(ratios), span_max=max(ratios))
            lines.append(f"{name:<22} {len(ratios):>6} {gm:>28.3f} {min(ratios):>6.2f} {max(ratios):>6.2f}  "
                         f"(device span, --trace)")
    for bf16, fp8, key8, label in (("jax.pallas_triton", "jax.pallas_triton.fp8", "fp8_speedup_vs_bf16", "Triton"),
                                   ("jax.pallas_mosaic_gpu", "jax.pallas_mosaic_gpu.fp8", "mosaic_fp8_speedup_vs_bf16",
                                    "Mosaic")):
        t_bf16 = {r["name"]: r["seconds"] for r in rows if r["impl"] == bf16 and "seconds" in r}
        ratios = [t_bf16[r["name"]] / r["seconds"] for r in rows
                  if r["impl"] == fp8 and "seconds" in r and r["name"] in t_bf16]
        if ratios:
            gm = plots.geomean(ratios)
            out[key8] = {"bf16": bf16, "fp8": fp8, "shapes": len(ratios), "geomean_speedup": gm,
                         "min": min(ratios), "max": max(ratios)}
            lines.append(f"{'fp8 vs bf16 ' + label:<22} {len(ratios):>6} {gm:>28.3f} {min(ratios):>6.2f} "
                         f"{max(ratios):>6.2f}  (time {bf16} / time {fp8})")
    text, ragged = _ragged_summary(rows, impls)
    if ragged:
        out["ragged_vs_twin"] = ragged
        lines += text
    gaps = [r for r in rows if r.get("fp8_gap")]
    if gaps:
        worst_out = max(r["out_rel_vs_first"] for r in gaps)
        worst_lse = max(r["lse_abs_vs_first"] for r in gaps)
        out["fp8_gap_vs_first"] = {"shapes": len(gaps), "max_out_rel": worst_out, "max_lse_abs": worst_lse}
        lines.append(f"fp8 gap vs the first bf16 impl (measured, not judged): out rel <= {worst_out:.1e}, "
                     f"lse abs <= {worst_lse:.1e} over {len(gaps)} shapes")
    return "\n".join(lines), out


def _dist_order(dist: str):
    return (DISTRIBUTIONS.index(dist) if dist in DISTRIBUTIONS else len(DISTRIBUTIONS), dist)


def _ragged_summary(rows, impls) -> tuple[list[str], dict]:
    """(lines, {impl: ...}) over the ragged rows: each impl's ragged time / its uniform twin's time (computed from
    the rows' seconds, so that merged shards count), overall and by distribution, with how many are within
    TWIN_TARGET; and each impl's speedup against the first impl over the ragged rows alone."""
    from parity import plots

    seconds = {(r["name"], r["impl"]): r["seconds"] for r in rows if "seconds" in r}
    key = "speedup_vs_" + impls[0]
    out, lines = {}, []
    for name in impls:
        mine = [r for r in rows if r["impl"] == name and "seconds" in r and twin_name(r) is not None]
        pairs = [(row_dist(r), r["seconds"] / seconds[(twin_name(r), name)]) for r in mine
                 if (twin_name(r), name) in seconds]
        speedups = [r[key] for r in mine if key in r] if name != impls[0] else []
        if not pairs and not speedups:
            continue
        entry = {}
        if pairs:
            ratios = [v for _, v in pairs]
            by_dist = {}
            for dist in sorted({d for d, _ in pairs}, key=_dist_order):
                vs = [v for d, v in pairs if d == dist]
                by_dist[dist] = {"shapes": len(vs), "geomean": plots.geomean(vs), "min": min(vs), "max": max(vs)}
            entry.update(shapes=len(ratios), geomean=plots.geomean(ratios), min=min(ratios), max=max(ratios),
                         within_target=sum(v <= TWIN_TARGET for v in ratios), target=TWIN_TARGET, by_dist=by_dist)
        if speedups:
            entry.update(speedup_shapes=len(speedups), geomean_speedup=plots.geomean(speedups),
                         speedup_min=min(speedups), speedup_max=max(speedups))
        out[name] = entry
    if not out:
        return [], {}
    lines.append(f"ragged rows against their uniform twins (same batch, q_len and total KV tokens): time ragged / "
                 f"time twin, target <= {TWIN_TARGET}")
    lines.append(f"{'impl':<26} {'shapes':>6} {'geomean':>8} {'min':>6} {'max':>6} {'<= ' + str(TWIN_TARGET):>8}  "
                 "by dist: geomean (min-max)")
    for name, e in out.items():
        if "shapes" not in e:
            continue
        dists = ", ".join(f"{d} {v['geomean']:.3f} ({v['min']:.2f}-{v['max']:.2f})" for d, v in e["by_dist"].items())
        lines.append(f"{name:<26} {e['shapes']:>6} {e['geomean']:>8.3f} {e['min']:>6.2f} {e['max']:>6.2f} "
                     f"{str(e['within_target']) + '/' + str(e['shapes']):>8}  {dists}")
    for name, e in out.items():
        if "speedup_shapes" in e:
            lines.append(f"{name:<22} {e['speedup_shapes']:>6} {e['geomean_speedup']:>28.3f} "
                         f"{e['speedup_min']:>6.2f} {e['speedup_max']:>6.2f}  (ragged rows only, {impls[0]}/impl)")
    return lines, out


def main(args) -> int:
    import torch

    grid_shapes(args.grid, getattr(args, "shard", None), getattr(args, "shapes", None))  # a bad name fails here
    save_dir = getattr(args, "save", None)
    if save_dir is not None:
        if getattr(args, "shard", None) or getattr(args, "shapes", None):
            print("--save writes a grid's baseline: the whole grid, not with --shard or --shapes", file=sys.stderr)
            return 2
        parent = os.path.dirname(os.path.abspath(save_dir))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
            print(f"--save {save_dir}: its directory {parent!r} is missing or not writable", file=sys.stderr)
            return 2

    if not torch.cuda.is_available():
        print("python -m parity bench needs a CUDA GPU (FA3 and the Pallas kernels are timed on it, and the "
              "roofline's ceilings measured there); none here. To draw a baseline: "
              f"python -m parity plot {BASELINE_DIR}/<gpu>/<grid>.json --png out.png")
        return 2
    import jax

    from parity import runner

    requested = args.impls or DEFAULT_IMPLS
    unknown = [i for i in requested if i not in timing.RUNNERS]
    if unknown:
        print(f"unknown impls {unknown}; known: {sorted(timing.RUNNERS)}", file=sys.stderr)
        return 2
    unavailable = {}
    for name in requested:
        reason = unavailable_reason(name)
        if reason is not None:
            unavailable[name] = reason
    impls = [i for i in requested if i not in unavailable]
    shard = getattr(args, "shard", None)
    names = getattr(args, "shapes", None)
    shapes = grid_shapes(args.grid, shard, names)
    print(f"bench grid={args.grid}{f' shard {shard[0]}/{shard[1]}' if shard else ''} ({len(shapes)} shapes) on {torch.cuda.get_device_name()}; "
          f"torch {torch.__version__}, jax {jax.__version__}; baseline {impls[0] if impls else '-'}", flush=True)
    for name, reason in unavailable.items():
        print(f"  not timed: {name}: {reason}", flush=True)
    if not impls:
        print("nothing to time here", file=sys.stderr)
        return 2
    ceilings = {}
    if not args.no_ceilings:
        try:
            ceilings = timing.measure_ceilings()
            print(f"ceilings: copy {ceilings['copy_TBps']:.2f} TB/s, bf16 matmul {ceilings['matmul_TFLOPps']:.0f} "
                  f"TFLOP/s (measured now)", flush=True)
        except Exception as e:  # the bench goes on; the roofline then uses the anchors' ceilings
            ceilings = {"ceilings_error": f"{type(e).__name__}: {e}"[:400]}
            print(f"ceilings not measured ({ceilings['ceilings_error']}); the roofline uses the anchors'", flush=True)

    launch_ms = getattr(args, "launch_ms", timing.LAUNCH_SECONDS * 1e3)
    cooldown_s = getattr(args, "cooldown", 0.0)

    def result(rows, summ=None):
        return {"grid": args.grid, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "launch_ms": launch_ms, **({"cooldown_s": cooldown_s} if cooldown_s else {}),
                "method": timing.METHOD, **ceilings, "complete": summ is not None, "impls": impls,
                "unavailable": unavailable,
                "summary": summ, "rows": rows, **({"shard": f"{shard[0]}/{shard[1]}"} if shard else {}),
                **({"shapes": [s.name for s in shapes]} if names is not None else {})}

    def write(rows, summ=None):
        if args.json:
            write_json(result(rows, summ), args.json)

    # On a terminal, a progress bar on stderr under the row lines; elsewhere the row lines alone.
    progress = runner.Progress(len(shapes) * len(impls), enabled=sys.stderr.isatty(), unit="row")
    try:
        rows = run_bench(shapes, impls, reps=args.reps, check=args.check, log=progress.log, checkpoint=write,
                         progress=progress, trace=getattr(args, "trace", False), slope=getattr(args, "slope", False),
                         launch_seconds=launch_ms * 1e-3, cooldown_s=cooldown_s)
    finally:
        progress.close()
    text, summ = summary(rows, impls)
    print("\n" + text)
    write(rows, summ)
    if args.json:
        print(f"wrote {args.json}")
    if args.png:
        from parity import plots

        plots.write_png_or_say_why(result(rows, summ), args.png)
    if save_dir is not None:  # the grid's baseline on this GPU kind, replaced whole
        from parity import plots

        json_path, png_path = baseline_paths(save_dir, torch.cuda.get_device_name(), args.grid)
        os.makedirs(os.path.dirname(json_path), exist_ok=True)
        write_json(result(rows, summ), json_path)
        print(f"wrote {json_path}")
        plots.write_png_or_say_why(result(rows, summ), png_path)
    errors = [r for r in rows if "error" in r and not r["error"].startswith("NotImplementedError")]
    bad = [r for r in rows if r.get("check_ok") is False]
    return 1 if errors or bad else 0
