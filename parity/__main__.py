"""python -m parity: cross-check paged MLA decode across stacks, or benchmark it.

  python -m parity [check] [--scenarios A,B] [--impls X,Y] [--dtypes bfloat16,float16] [--json PATH] [--png PATH]
  python -m parity bench [--grid NAME] [--impls X,Y] [--shard I/N] [--json PATH] [--png PATH]
  python -m parity merge SHARD_JSON... --json PATH [--png PATH]
  python -m parity plot RESULTS_JSON --png PATH
  python -m parity list

`check` (the default) runs every implementation that can run here on each scenario
against the torch reference, and FA3 against each Pallas kernel and FlashMLA where both
run, and prints a table; the exit code is 1 on any failure or error (skips, with their
reason, are not failures). `--png` draws the error distributions (matplotlib, the
`notebooks` extra; without it the JSON is still written). `bench` times every available
implementation side by side and draws a roofline against the machine's measured copy
and matmul rates (`--shard I/N` times every N-th shape, e.g. half a grid per GPU; `merge`
joins the shards' JSONs and their summary; `--save` writes the grid's baseline, benchmarks/<gpu>/<grid>.json and
.png). `plot` redraws either PNG from a JSON written earlier (e.g. a baseline in benchmarks/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _write_json(path: str, obj) -> bool:
    """Writes `obj` as JSON to `path`; on an OSError says so on stderr (one line) and returns False."""
    try:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
    except OSError as e:
        print(f"cannot write {path}: {e}", file=sys.stderr)
        return False
    return True


def _check(args) -> int:
    from parity import runner
    from parity.scenarios import SCENARIOS

    names = args.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios {unknown}; see `python -m parity list`", file=sys.stderr)
        return 2
    impls = args.impls or runner.default_impls()
    try:
        runner.check_comparable(impls)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtypes = args.dtypes or ["bfloat16", "float16"]
    env = runner.environment()
    print(f"parity check on {env['device']} (torch {env['torch']}, jax {env['jax']} on {env['jax_backend']}); "
          f"baseline {runner.BASELINE}", flush=True)
    t0 = time.perf_counter()
    progress = runner.Progress(runner.num_items(names, dtypes, impls), enabled=not args.quiet)
    try:
        rows = runner.run_parity([SCENARIOS[n] for n in names], dtypes, impls, seed=args.seed, progress=progress)
    except ValueError as e:
        progress.close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    progress.close()
    print(runner.format_table(rows))
    bad = [r for r in rows if r.status in ("FAIL", "ERROR")]
    ran = sum(r.status == "pass" for r in rows)
    skipped = sum(r.status == "skip" for r in rows)
    known = sum(r.status == "known" for r in rows)
    print(f"\n{ran} passed, {len(bad)} failed, {skipped} skipped" + (f", {known} known limitations" if known else "")
          + f" in {time.perf_counter() - t0:.1f} s")
    report = {"environment": env, "rows": [r.as_dict() for r in rows]}
    if args.json:
        if not _write_json(args.json, report):
            return 2
        print(f"wrote {args.json}")
    if args.png:
        from parity import plots

        plots.write_png_or_say_why(report, args.png)  # a missing matplotlib is said, not a failure of the check
    return 1 if bad else 0


def _read_json(path: str):
    """The JSON value in the file at `path`; ValueError with a one-line reason naming the path when it cannot be
    read (missing, not UTF-8, not JSON)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"cannot read {path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"cannot read {path}: not JSON ({e})") from e


def _plot(args) -> int:
    from parity import plots

    try:
        results = _read_json(args.results)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        plots.report_kind(results)
    except ValueError as e:
        print(f"{args.results}: {e}", file=sys.stderr)
        return 2
    return 0 if plots.write_png_or_say_why(results, args.png) else 2


def _merge(args) -> int:
    from parity import bench

    try:
        merged = bench.merge([_read_json(path) for path in args.results], sources=args.results)
    except ValueError as e:
        print(f"cannot merge: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"cannot merge: a result has no {e} entry", file=sys.stderr)
        return 2
    text, _ = bench.summary(merged["rows"], merged["impls"])
    print(text)
    if not _write_json(args.json, merged):
        return 2
    print(f"wrote {args.json} ({len(merged['rows'])} rows, complete={merged['complete']})")
    if args.png:
        from parity import plots

        plots.write_png_or_say_why(merged, args.png)
    return 0


def _bench(args) -> int:
    from parity import bench

    return bench.main(args)


def _list(args) -> int:
    from parity import runner
    from parity.scenarios import SCENARIOS

    for sc in SCENARIOS.values():
        print(f"{sc.name:<22} H={sc.num_heads:<4} P={sc.page_size:<3} seq_lens={sc.seq_lens} query_lens={sc.query_lens}")
    print("implementations:", ", ".join(runner.all_impls()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from parity.bench import csv_names, nonnegative_int

    p = argparse.ArgumentParser(prog="python -m parity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")

    def check_args(q):
        q.add_argument("--scenarios", type=csv_names, help="comma-separated scenario names (default: all)")
        q.add_argument("--impls", type=csv_names, help="comma-separated implementations (default: all that can run)")
        q.add_argument("--dtypes", type=csv_names, help="comma-separated dtypes (default: bfloat16,float16)")
        q.add_argument("--seed", type=nonnegative_int, default=0, help="the inputs' seed, an integer >= 0")
        q.add_argument("--json", help="write the report here")
        q.add_argument("--png", help="draw the error distributions here (needs matplotlib)")
        q.add_argument("--quiet", action="store_true", help="no progress bar or lines")

    check_args(p)
    check_args(sub.add_parser("check", help="cross-check implementations (the default)"))
    b = sub.add_parser("bench", help="time implementations side by side on a named grid")
    from parity import bench

    bench.add_arguments(b)
    pl = sub.add_parser("plot", help="draw a PNG from a parity or bench JSON (e.g. benchmarks/h200/mosaic.json)")
    pl.add_argument("results", help="a JSON written by `python -m parity --json` or `python -m parity bench --json`")
    pl.add_argument("--png", required=True, help="where to write the PNG")
    m = sub.add_parser("merge", help="join the JSONs of `bench --shard` runs of one grid into one")
    m.add_argument("results", nargs="+", help="bench JSONs of the shards")
    m.add_argument("--json", required=True, help="write the joined result here")
    m.add_argument("--png", help="draw its roofline here (needs matplotlib)")
    sub.add_parser("list", help="list scenarios and implementations")
    return p


OUTPUT_OPTIONS = ("json", "png")
"""The options of every subcommand that name a file to write."""


def check_output_paths(parser: argparse.ArgumentParser, args) -> None:
    """Refuse (parser.error, exit 2) an output path whose directory is missing or not writable before anything
    runs, rather than failing to write it after the run."""
    from parity.bench import check_output_path

    for opt in OUTPUT_OPTIONS:
        path = getattr(args, opt, None)
        if path is None:
            continue
        why = check_output_path(path)
        if why is not None:
            parser.error(f"argument --{opt}: cannot write {path!r}: {why}")


def check_bench_shapes(parser: argparse.ArgumentParser, args) -> None:
    """Refuse (parser.error, exit 2) `bench --shapes` names that are not in the grid, or none of them in the
    --shard, before anything runs. Which names a grid holds depends on --grid, so the option's `type=` cannot
    check them."""
    if getattr(args, "command", None) != "bench" or args.shapes is None:
        return
    from parity.shapes import grid_shapes

    try:
        grid_shapes(args.grid, args.shard, args.shapes)
    except ValueError as e:
        parser.error(str(e))


def prepare_process() -> None:
    """What this process needs before its first JAX computation: JAX takes GPU memory as it goes, beside torch, rather
    than most of it at once; and XLA:CPU's pool is wide enough for Mosaic GPU's interpreter (parity/_cpu_pool.py).
    Each is left as the user set it."""
    from parity._cpu_pool import widen_cpu_pool

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    widen_cpu_pool()


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_output_paths(parser, args)
    check_bench_shapes(parser, args)
    prepare_process()
    if args.command == "bench":
        return _bench(args)
    if args.command == "merge":
        return _merge(args)
    if args.command == "list":
        return _list(args)
    if args.command == "plot":
        return _plot(args)
    return _check(args)


if __name__ == "__main__":
    sys.exit(main())
