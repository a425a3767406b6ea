"""python -m parity bench: implementations timed side by side, in one process, on
named grids of (num_heads, batch, seq_len, q_len) at page_size 64.

Method (the same for both stacks, so host dispatch cannot decide a ratio): N
back-to-back calls per launch, timed with a host clock around launch + device
synchronize, median of several launches, divided by N (`seconds`).
  - torch (FA3, FlashMLA): N calls captured once in a CUDA graph, the graph replayed.
  - JAX (Pallas kernels): N calls inside one jitted `lax.fori_loop`, 4 per iteration, one
    per query buffer (4 separate arrays, each passed through an optimization barrier with
    the loop index, so nothing is loop-invariant and nothing is copied), all 4 results
    carried (so nothing is dead). N is a multiple of 4.
N is chosen per shape so that an N-call launch lasts about `--launch-ms` (default 25 ms; 20 <= N <= 8000):
long enough that what a launch costs once (the JAX loop's launches carried 0.1-0.7 ms outside its
kernels on the H200, session 5; sessions 1-6 used 3 ms launches, N <= 400, where that cost was up to
a fifth of a small shape's time) is a small part of t(N)/N. The JAX loop's trip count is static (a
traced one makes XLA read the loop predicate back every iteration).
With --trace each row also gets the device's view of one N-call launch (the JAX profiler's trace,
CUPTI, which sees both stacks' kernels: `python -m parity.timeline`): `span_seconds`, from the first
kernel's start to the last one's end, and `busy_seconds`, the kernels' summed time, per call, and per
launch `launch_lead_seconds` / `launch_tail_seconds`, the host-side time before the first kernel starts
and after the last one ends (where a launch's own cost shows); the summary adds the geomean of the
span ratios (the issue's "profiler's kernel times" method: no host time in it, while the gaps
between a loop's kernels count). With --slope each row also gets `seconds_slope`,
(t(2N) - t(N)) / N from launches of N and 2N calls, which drops what a launch costs once: on the
H200 the JAX loop's launches carried 0.1-0.7 ms outside its kernels' device span (the JAX
profiler's trace, `python -m parity.timeline`, session 5), varying from launch to launch, which
`seconds` spreads over the N calls (so small JAX shapes read slower than their kernels run). Its
noise is that jitter / N (some us at N = 80), so it is a diagnostic, not the ratio's number.
With --cooldown S the GPU idles S seconds before each row's timed launches, so every impl starts them
from the same state rather than right after the impl before it: on the H200 (session 13) the fp8
Mosaic kernel, whose conversion keeps the SMs busy, timed 604 us at H16 B128 S16384 before FA3 ran,
699 us right after FA3's timing and 604 us again after a 3 s idle (bf16 Mosaic, memory-bound: 559 /
566 / 559); rows are timed in --impls order, so without it a later impl inherits the earlier ones' heat.

Bytes = KV read once (sum of seq_lens x 576 x 2) + q + out; FLOPs = 2 x H x T x S x (576 + 512)
(the causal savings of q_len > 1 are not subtracted, as for the FA3 anchors). An fp8 row
(`*.fp8`, opted into with --impls) counts its KV at 1 byte per element (q and out
stay bf16), and its TB/s comes from those bytes (the row's own `bytes`, which the roofline uses).

FP8 (`jax.pallas_triton.fp8`, `jax.pallas_mosaic_gpu.fp8`): the same bf16 inputs, the cache quantized once per shape to
float8_e4m3fn with one float32 scale k_scale = amax(|kv|) / 448 (vLLM's convention: real value =
fp8 value x k_scale; `quantize_fp8`), timed with k_scale traced. With --check its out/lse gap to
the first bf16 impl is recorded (`out_rel_vs_first`, `lse_abs_vs_first`, `fp8_gap: true`), not
judged: fp8 is not expected to match bf16 within bf16's tolerance, so it sets no `check_ok`. The
summary adds `fp8_speedup_vs_bf16`: the geomean of time(jax.pallas_triton) / time(the fp8 row)
over the shapes where both were timed (`mosaic_fp8_speedup_vs_bf16` likewise for the Mosaic kernel).

Ceilings (`measure_ceilings`, before the shapes, unless --no-ceilings): the machine's copy
rate (a 2 GiB device-to-device copy, bytes read + written) and bf16 matmul rate (8192^3),
each the median of 10 runs timed with CUDA events, stored in the JSON as copy_TBps and
matmul_TFLOPps; the roofline (`--png`, parity/plots.py) is drawn under them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

PAGE_SIZE = 64


@dataclasses.dataclass(frozen=True)
class Shape:
    num_heads: int
    batch: int
    seq_len: int
    q_len: int = 1
    page_size: int = PAGE_SIZE
    dtype: str = "bfloat16"

    @property
    def name(self) -> str:
        return f"H{self.num_heads}_B{self.batch}_S{self.seq_len}_q{self.q_len}"

    @property
    def num_tokens(self) -> int:
        return self.batch * self.q_len

    def bytes(self, L=512, R=64, itemsize=2, kv_itemsize=None) -> int:
        """KV read once + q + out; kv_itemsize (default itemsize) for the cache: 1 for fp8."""
        kv = self.batch * self.seq_len * (L + R) * (itemsize if kv_itemsize is None else kv_itemsize)
        q = self.num_tokens * self.num_heads * (L + R) * itemsize
        out = self.num_tokens * self.num_heads * L * itemsize
        return kv + q + out

    def flops(self, L=512, R=64) -> int:
        return 2 * self.num_heads * self.num_tokens * self.seq_len * (L + R + L)


def _grid(heads, batches, seqs, q_lens):
    return [Shape(h, b, s, q) for q in q_lens for h in heads for b in batches for s in seqs]


GRIDS = {
    # issue [pallas-triton]: H x B x S x q_len at page 64
    "triton": _grid((16, 128), (1, 8, 32, 64, 128), (1024, 4096, 16384), (1, 2)),
    # issue [mosaic]: the same plus (H=128, B=128, S=8192, q_len=2)
    "mosaic": _grid((16, 128), (1, 8, 32, 64, 128), (1024, 4096, 16384), (1, 2)) + [Shape(128, 128, 8192, 2)],
    # issue [mosaic]'s H = 16, q_len 2 rows alone (where session 9 moved the heuristic to the plain scores)
    "mosaic_h16_q2": _grid((16,), (1, 8, 32, 64, 128), (1024, 4096, 16384), (2,)),
    # the anchors' headline shapes (memory-bound, compute-bound, latency)
    "headline": [Shape(16, 128, 16384), Shape(128, 64, 16384), Shape(16, 1, 1024), Shape(128, 1, 1024),
                 Shape(16, 64, 4096, 2), Shape(128, 32, 4096)],
    "smoke": [Shape(16, 4, 1024), Shape(128, 2, 2048, 2)],
    # fp8 KV cache against bf16 (--impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8): memory-bound and mid
    "fp8": [Shape(16, 128, 16384), Shape(16, 64, 4096, 2), Shape(16, 32, 16384), Shape(128, 64, 16384),
            Shape(128, 32, 4096), Shape(16, 1, 1024), Shape(128, 1, 1024)],
    # fp8 with each request's last step masked (sequence lengths one short of a multiple of 64, as most real ones are
    # not multiples): the fp8 grid's bytes-bound rows and the 32-row ones (session 27: the masked step had cost the
    # 32-row kernel ~9 us a call, hidden at S4096 q_len 1)
    "fp8_tails": [Shape(16, 128, 16383), Shape(16, 64, 4095, 2), Shape(16, 32, 16383), Shape(32, 64, 4095),
                  Shape(16, 8, 4095), Shape(128, 64, 16383), Shape(16, 1, 1023)],
}

DEFAULT_IMPLS = ["torch.fa3", "torch.flashmla", "jax.pallas_triton", "jax.pallas_mosaic_gpu"]

FP8_IMPLS = {"jax.pallas_triton.fp8", "jax.pallas_mosaic_gpu.fp8"}
"""Impls that read an fp8 copy of the bf16 cache: 1-byte KV in their bytes, a recorded gap under --check."""

FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value


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
    """Why `path` cannot be written (its folder missing or not writable, or it is a folder), or None: checked
    before a run, so that a typo fails at once rather than after the run, with its results lost."""
    if not path:
        return "an empty path"
    if os.path.isdir(path):
        return "it is a directory"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"its directory {parent!r} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {parent!r} is not writable"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "it is not writable"
    return None


def add_arguments(p):
    p.add_argument("--grid", default="headline", choices=sorted(GRIDS), help="named grid (default: headline)")
    p.add_argument("--impls", type=csv_names, default=None,
                   help=f"comma-separated (default: {','.join(DEFAULT_IMPLS)}); those that cannot run here are "
                        "left out, saying why; the first that runs is the ratio's baseline")
    p.add_argument("--reps", type=positive_int, default=7, help="timed launches per shape (median taken; >= 1)")
    p.add_argument("--check", action="store_true", help="also compare each impl's out/lse with the first impl")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--png", help="draw the roofline here (needs matplotlib)")
    p.add_argument("--shard", type=arg_type(parse_shard), default=None, metavar="I/N",
                   help="time only shapes I, I+N, I+2N, ... of the grid (0 <= I < N), e.g. one half per GPU; "
                        "`python -m parity merge` joins the shards' JSONs")
    p.add_argument("--shapes", type=csv_names, default=None,
                   help="time only these shapes of the grid, comma-separated names such as H16_B64_S1024_q2 "
                        "(each must be in the grid; with --shard, those of the shard)")
    p.add_argument("--trace", action="store_true",
                   help="also time each row on the device: one N-call launch traced with the JAX profiler "
                        "(parity.timeline), its kernels' span and busy time per call; the summary adds the "
                        "geomean of the span ratios")
    p.add_argument("--slope", action="store_true",
                   help="also time launches of 2N calls: seconds_slope = (t(2N) - t(N)) / N per row (a diagnostic)")
    p.add_argument("--launch-ms", type=arg_type(parse_launch_ms), default=LAUNCH_SECONDS * 1e3,
                   help=f"what one timed launch of N calls lasts, N chosen per shape (default {LAUNCH_SECONDS * 1e3:g}; "
                        "sessions 1-6 used 3)")
    p.add_argument("--cooldown", type=arg_type(parse_cooldown), default=0.0, metavar="S",
                   help="idle S seconds before each row's timed launches, so that no impl is timed right after "
                        "another one's (default 0: timed back to back, as sessions 1-13 did)")
    p.add_argument("--no-ceilings", action="store_true",
                   help="do not measure the copy/matmul ceilings (the roofline then uses the anchors' numbers)")


def parse_launch_ms(text: str) -> float:
    """--launch-ms: a positive number of milliseconds."""
    try:
        ms = float(text)
    except ValueError:
        ms = math.nan
    if not ms > 0:
        raise ValueError(f"launch-ms must be a positive number of milliseconds, got launch_ms={text!r}")
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


def grid_shapes(grid: str, shard: tuple[int, int] | None = None, names: list[str] | None = None) -> list:
    """The shapes of GRIDS[grid] a run times: every N-th from the I-th with shard (I, N), then only those
    named in `names` (in grid order); a name not in the grid is a ValueError naming it."""
    shapes = GRIDS[grid]
    if names is not None:
        unknown = [n for n in names if n not in {s.name for s in shapes}]
        if unknown:
            raise ValueError(f"--shapes {','.join(unknown)} not in grid {grid!r} "
                             f"({', '.join(s.name for s in shapes)})")
    if shard is not None:
        shapes = shapes[shard[0]::shard[1]]
    if names is not None:
        shapes = [s for s in shapes if s.name in names]
        if not shapes:
            where = f"shard {shard[0]}/{shard[1]} of grid {grid!r}" if shard else f"grid {grid!r}"
            raise ValueError(f"--shapes {','.join(names)!r}: none in {where}")
    return shapes


def merge(results: list[dict]) -> dict:
    """Joins bench JSONs of shards of one grid (same impls; rows concatenated, in grid order) and
    recomputes the summary over all rows. complete: every shard finished and every shape is there."""
    if not results:
        raise ValueError("merge needs at least one bench result")
    first = results[0]
    for r in results[1:]:
        for key in ("grid", "impls", "xla_flags", "launch_ms", "cooldown_s"):
            if r.get(key) != first.get(key):
                raise ValueError(f"cannot merge results of different {key}: {first.get(key)!r} vs {r.get(key)!r}")
    order = {shape.name: k for k, shape in enumerate(GRIDS[first["grid"]])}
    rows = sorted((row for r in results for row in r["rows"]), key=lambda row: order.get(row["name"], len(order)))
    names = {row["name"] for row in rows}
    _, summ = summary(rows, first["impls"])
    merged = {k: v for k, v in first.items() if k not in ("rows", "summary", "shard", "shapes")}
    merged.update(rows=rows, summary=summ, shards=[r.get("shard") for r in results],
                  complete=all(r.get("complete") for r in results) and names >= set(order),
                  unavailable={k: v for r in results for k, v in r.get("unavailable", {}).items()})
    return merged


# ----------------------------------------------------------------------------- ceilings


def measure_ceilings(copy_bytes: int = 2 << 30, matmul_n: int = 8192, reps: int = 10, warmup: int = 3) -> dict:
    """The machine's roofline ceilings, measured on the current CUDA device:
    copy_TBps: a `copy_bytes` device-to-device copy, counting bytes read + written;
    matmul_TFLOPps: a bf16 [n, n] @ [n, n] matmul, 2 n^3 FLOPs.
    Each is the median of `reps` runs (after `warmup`), timed with CUDA events.
    Raises RuntimeError, saying so, where torch sees no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings needs a CUDA GPU (it times a device-to-device copy and a bf16 matmul "
                           "on it); torch sees none")
    for name, v in (("copy_bytes", copy_bytes), ("matmul_n", matmul_n), ("reps", reps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {name}={v!r}")

    def median_ms(fn, *args):
        for _ in range(warmup):
            fn(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    src.fill_(1)
    dst = torch.empty_like(src)
    copy_ms = median_ms(dst.copy_, src)
    del src, dst
    n = matmul_n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    mm_ms = median_ms(functools.partial(torch.matmul, out=c), a, b)
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "copy_TBps": 2 * copy_bytes / (copy_ms * 1e-3) / 1e12,
        "matmul_TFLOPps": 2 * n**3 / (mm_ms * 1e-3) / 1e12,
        "ceilings": {
            "method": f"median of {reps} runs after {warmup} warm-up, CUDA events; copy: Tensor.copy_ of "
                      f"{copy_bytes} bytes device to device, read + written counted; matmul: bf16 "
                      f"[{n}, {n}] @ [{n}, {n}], 2 n^3 FLOPs",
            "copy_bytes": copy_bytes, "copy_ms": copy_ms, "matmul_n": n, "matmul_ms": mm_ms,
            "device": torch.cuda.get_device_name(),
        },
    }


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


# ----------------------------------------------------------------------------- inputs


@dataclasses.dataclass
class BenchInputs:
    shape: Shape
    config: object
    metadata: object  # mla_spec.DecodeMetadata (NumPy)
    q: object  # torch [4, T, H, 576] (4 rotating buffers)
    kv_cache: object  # torch [num_blocks, P, 576]


def shape_config(shape: Shape, **overrides):
    """The MLAConfig of a bench shape (overrides: e.g. kv_cache_dtype="fp8_e4m3")."""
    from mla_spec import MLAConfig

    return MLAConfig(num_heads=shape.num_heads, page_size=shape.page_size, dtype=shape.dtype,
                     max_num_seqs=max(256, shape.batch), **overrides)


def make_inputs(shape: Shape, seed: int = 0) -> BenchInputs:
    import torch

    from mla_spec import build_decode_metadata

    config = shape_config(shape)
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = -(-shape.seq_len // shape.page_size)
    num_blocks = shape.batch * pages + 1
    perm = (torch.randperm(num_blocks - 1, generator=g, device="cuda") + 1).to(torch.int32)
    block_table = perm.view(shape.batch, pages).cpu().numpy()
    md = build_decode_metadata(seq_lens=[shape.seq_len] * shape.batch, query_lens=[shape.q_len] * shape.batch,
                               block_table=block_table, config=config, num_blocks=num_blocks)
    dt = getattr(torch, shape.dtype)
    kv = torch.randn(num_blocks, shape.page_size, config.head_dim, generator=g, device="cuda", dtype=dt)
    q = torch.randn(4, shape.num_tokens, shape.num_heads, config.head_dim, generator=g, device="cuda", dtype=dt)
    return BenchInputs(shape, config, md, q, kv)


def quantize_fp8(kv_cache):
    """(kv_fp8, k_scale): a torch cache (finite values, any float dtype and device) quantized to
    float8_e4m3fn with one per-tensor scale k_scale = amax(|kv|) / 448 (a float32 value, returned as a
    Python float; 1.0 for an all-zero cache), vLLM's convention: real value = fp8 value * k_scale."""
    import torch

    amax = float(kv_cache.abs().amax().float())
    k_scale = float(torch.tensor(amax / FP8_E4M3_MAX if amax > 0 else 1.0, dtype=torch.float32))
    scaled = kv_cache.to(torch.float32, copy=True).div_(k_scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn), k_scale


def row_bytes(shape: Shape, impl: str) -> int:
    """The bytes of one row: Shape.bytes, with the KV at 1 byte per element for an fp8 impl."""
    return shape.bytes(kv_itemsize=1 if impl in FP8_IMPLS else None)


# ----------------------------------------------------------------------------- runners
# Each returns (call_once() -> (out, lse), time_n(n) -> a callable that runs n calls and syncs).


def _torch_graph_timer(fn, q):
    import torch

    def time_n(n):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(3):
                fn(q[i % 4])  # warm up on the side stream before capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        # thread_local: a CUDA call from another thread of the process (JAX's runtime, the profiler's
        # flush after a traced row) must not invalidate this capture; with the default ("global") one
        # did, on the H200 in session 7 ("operation failed due to a previous error during capture")
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for i in range(n):
                fn(q[i % 4])

        def run(_inputs=(fn, q)):
            # _inputs: the graph reads what fn and q hold (FA3's metadata, FlashMLA's block table...) at
            # their captured addresses; without this reference they were freed when the caller dropped
            # fn, and a later torch allocation (quantize_fp8's copy) overwrote them: an illegal address or
            # a hang at the next replay (session 8, the fp8 sweep)
            graph.replay()
            torch.cuda.synchronize()

        return run

    return time_n


def torch_fa3(inp: BenchInputs):
    from mla_torch import fa3

    device = inp.kv_cache.device
    builder = fa3.FlashAttnMLAMetadataBuilder(inp.config, device)  # eager mode: FA3's own split heuristic
    attn_md = builder.build(inp.metadata, num_blocks=int(inp.kv_cache.shape[0]))
    impl = fa3.FlashAttnMLAImpl.from_config(inp.config, device)

    def fn(q):
        return impl._forward_decode(q, inp.kv_cache, attn_md)

    return (lambda: fn(inp.q[0])), _torch_graph_timer(fn, inp.q)


def torch_flashmla(inp: BenchInputs):
    import torch

    from vllm.third_party.flashmla.flash_mla_interface import flash_mla_with_kvcache, get_mla_metadata

    s = inp.shape
    md = inp.metadata
    bt = torch.as_tensor(md.block_table, device="cuda")
    seq_lens = torch.as_tensor(md.seq_lens, device="cuda")
    kv = inp.kv_cache.unsqueeze(2)  # [num_blocks, P, 1, 576]
    sched, _ = get_mla_metadata()

    def fn(q):
        out, lse = flash_mla_with_kvcache(q.view(s.batch, s.q_len, s.num_heads, -1), kv, bt, seq_lens, 512, sched,
                                          None, softmax_scale=inp.config.softmax_scale, causal=True)
        return out.view(s.num_tokens, s.num_heads, 512), lse.permute(0, 2, 1).reshape(s.num_tokens, s.num_heads)

    fn(inp.q[0])  # the first call fills the schedule; later calls (and the graph) reuse it
    return (lambda: fn(inp.q[0])), _torch_graph_timer(fn, inp.q)


def timed_loop(call, n, qs, *args):
    """n calls of call(q, *args) -> (out, lse) in one `lax.fori_loop` of static trip count (jit it
    with call and n static), 4 per iteration, one per query buffer of qs.

    (A traced n cost ~15 us a call on the H200 here: XLA then reads the loop predicate back to
    the host every iteration.) The buffers are separate arrays (q[i % 4] of one array is a
    dynamic-slice copy of q per call: 8.7 us at H128 B64 in the profile, a cost FA3's graph does
    not pay), made loop-variant through an optimization barrier with the loop index (no copy;
    else XLA could hoist the calls out of the loop). All results are carried and returned: a
    carried value the jit does not return is dead, and XLA drops the calls that make it
    (returning only the last pair timed 1 call in 4, seen on the H200)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    if n % len(qs):
        raise ValueError(f"n must be a multiple of {len(qs)}, got {n=}")
    out0 = jax.eval_shape(call, qs[0], *args)

    def body(i, carry):
        results = ()
        for qk in qs:
            qk, _ = lax.optimization_barrier((qk, i))
            results += tuple(call(qk, *args))
        return results

    init = tuple(jnp.zeros(x.shape, x.dtype) for x in out0) * len(qs)
    return lax.fori_loop(0, n // len(qs), body, init)


def _jax_kernel(impl: str, tuning=None, fp8: bool = False, interpret: bool = False, overrides=None):
    """A runner for mla_jax.<impl>.mla_decode; with fp8, on the cache quantized by quantize_fp8
    (kv_cache_dtype="fp8_e4m3") and its k_scale passed traced. interpret: Pallas interpret mode, on
    any device (the CPU tests of this runner; never timed). overrides (Triton only): fields replaced
    in the heuristic's pick for each shape (e.g. num_stages=3)."""

    def make(inp: BenchInputs):
        import importlib

        import jax
        import jax.numpy as jnp
        from jax import lax

        import mla_jax

        mod = importlib.import_module(f"mla_jax.{impl}")
        config = inp.config.replace(kv_cache_dtype="fp8_e4m3") if fp8 else inp.config
        reason = mod.unsupported_reason(config, None if interpret else jax.devices()[0])
        if reason is not None:
            raise NotImplementedError(reason)
        md = mla_jax.to_jax_metadata(inp.metadata)
        q = jax.dlpack.from_dlpack(inp.q)
        run_tuning = tuning
        if overrides:
            h = inp.metadata
            base = mod.heuristic_config(config, h.num_decode_tokens, h.max_blocks, max_query_len=h.max_query_len,
                                        num_reqs=h.num_reqs, max_num_splits=h.max_num_splits)
            from parity.sweep import with_overrides

            run_tuning = with_overrides(base, overrides)
        if fp8:
            import torch

            kv_fp8, k_scale = quantize_fp8(inp.kv_cache)
            # through uint8: DLPack's float8 codes are newer than some torch / JAX pairs
            kv = lax.bitcast_convert_type(jax.dlpack.from_dlpack(kv_fp8.view(torch.uint8)), jnp.float8_e4m3fn)
        else:
            kv, k_scale = jax.dlpack.from_dlpack(inp.kv_cache), 1.0
        scale = jnp.float32(k_scale)  # a jit argument: traced (read only with fp8)
        extra = {"interpret": True} if interpret else {}

        def call(qi, kv, md, scale):
            # the packed q, as mla_jax.mla_decode gives it to both kernels
            if fp8:
                return mod.mla_decode(qi, None, kv, md, config, tuning=run_tuning, k_scale=scale, **extra)
            return mod.mla_decode(qi, None, kv, md, config, tuning=run_tuning, **extra)

        loop = functools.partial(jax.jit, static_argnums=(0, 1))(timed_loop)
        once = jax.jit(call)
        qs = tuple(q[k] for k in range(q.shape[0]))  # 4 separate buffers (sliced once, outside the loop)

        def time_n(n):
            if n % len(qs):
                raise ValueError(f"n must be a multiple of {len(qs)}, got {n=}")
            return lambda: jax.block_until_ready(loop(call, n, qs, kv, md, scale))

        return (lambda: jax.block_until_ready(once(qs[0], kv, md, scale))), time_n

    return make


RUNNERS = {
    "torch.fa3": torch_fa3,
    "torch.flashmla": torch_flashmla,
    "jax.pallas_triton": _jax_kernel("pallas_triton"),
    "jax.pallas_mosaic_gpu": _jax_kernel("pallas_mosaic_gpu"),
    "jax.pallas_triton.fp8": _jax_kernel("pallas_triton", fp8=True),
    "jax.pallas_mosaic_gpu.fp8": _jax_kernel("pallas_mosaic_gpu", fp8=True),
}


def _median_seconds(run, reps: int) -> float:
    if not (isinstance(reps, int) and reps >= 1):  # statistics.median([]) would fail after the warm-up run
        raise ValueError(f"reps must be an integer >= 1, got reps={reps!r}")
    run()  # compile / warm
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclasses.dataclass
class LaunchTimer:
    """Launches of n and (optionally) of 2n back-to-back calls (each run() makes its calls and syncs)."""

    short: object
    long: object | None
    n: int

    def measure(self, reps: int) -> tuple[float, float]:
        """(seconds per call of one n-call launch, t(n) / n, the median over `reps` launches: the bench's
        number; the slope between the launches, (t(2n) - t(n)) / n of their medians: NaN without the 2n
        launch or if t(2n) <= t(n))."""
        t_short = _median_seconds(self.short, reps)
        if self.long is None:
            return t_short / self.n, float("nan")
        t_long = _median_seconds(self.long, reps)
        slope = (t_long - t_short) / self.n if t_long > t_short else float("nan")
        return t_short / self.n, slope


LAUNCH_SECONDS = 25e-3  # what an n-call launch lasts (calibrate's default; --launch-ms)
MAX_CALLS = 8000


def calibrate(make, inp: BenchInputs, slope: bool = False, launch_seconds: float = LAUNCH_SECONDS):
    """(LaunchTimer, result of one call): n chosen so that an n-call launch lasts about launch_seconds
    (20 <= n <= MAX_CALLS, a multiple of 4); with slope a 2n-call launch too; compiled / captured and warmed."""
    if not launch_seconds > 0:
        raise ValueError(f"launch_seconds must be > 0, got {launch_seconds=}")
    once, time_n = make(inp)
    result = once()
    run = time_n(20)
    t_est = _median_seconds(run, 3) / 20
    n = int(min(MAX_CALLS, max(20, math.ceil(launch_seconds / max(t_est, 1e-7)))))
    n = -(-n // 4) * 4  # the JAX loop makes 4 calls per iteration
    timer = LaunchTimer(run if n == 20 else time_n(n), time_n(2 * n) if slope else None, n)
    timer.short()
    if slope:
        timer.long()
    return timer, result


def run_bench(shapes, impls, reps=7, check=False, log=print, checkpoint=None, progress=None, trace=False,
              slope=False, launch_seconds=LAUNCH_SECONDS, cooldown_s=0.0):
    import torch

    from parity.compare import compare_out_lse
    from parity.runner import _to_np

    rows = []
    for shape in shapes:
        inp = make_inputs(shape)
        base = None  # the first bf16 impl's (out, lse): what --check compares the others with
        for name in impls:
            if progress:
                progress(f"{shape.name} {name}")
            fp8 = name in FP8_IMPLS
            nbytes = row_bytes(shape, name)
            row = {"shape": dataclasses.asdict(shape), "name": shape.name, "impl": name,
                   "bytes": nbytes, "flops": shape.flops()}
            if fp8:
                row["kv_cache_dtype"] = "fp8_e4m3"
            try:
                timer, (out, lse) = calibrate(RUNNERS[name], inp, slope=slope, launch_seconds=launch_seconds)
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
                    from parity import timeline

                    events, window = timeline.trace_launch(timer.short)
                    t = timeline.summarize(events, timer.n, window)
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
    return rows


def _fmt_row(r):
    if "error" in r:
        return f"{r['name']:<24} {r['impl']:<22} ERROR {r['error'][:120]}"
    extra = ""
    if "check_ok" in r:
        extra = f"  check {'ok' if r['check_ok'] else 'FAIL'} (out {r['out_rel_vs_first']:.1e}, lse {r['lse_abs_vs_first']:.1e})"
    elif r.get("fp8_gap"):
        extra = f"  fp8 gap vs first (out rel {r['out_rel_vs_first']:.1e}, lse abs {r['lse_abs_vs_first']:.1e})"
    span = f"  span {r['span_seconds'] * 1e6:.1f} us" if "span_seconds" in r else ""
    return (f"{r['name']:<24} {r['impl']:<22} {r['seconds'] * 1e6:>9.1f} us {r['TBps']:>6.2f} TB/s "
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
    gaps = [r for r in rows if r.get("fp8_gap")]
    if gaps:
        worst_out = max(r["out_rel_vs_first"] for r in gaps)
        worst_lse = max(r["lse_abs_vs_first"] for r in gaps)
        out["fp8_gap_vs_first"] = {"shapes": len(gaps), "max_out_rel": worst_out, "max_lse_abs": worst_lse}
        lines.append(f"fp8 gap vs the first bf16 impl (measured, not judged): out rel <= {worst_out:.1e}, "
                     f"lse abs <= {worst_lse:.1e} over {len(gaps)} shapes")
    return "\n".join(lines), out


def main(args) -> int:
    import torch

    grid_shapes(args.grid, getattr(args, "shard", None), getattr(args, "shapes", None))  # a bad name fails here

    if not torch.cuda.is_available():
        print("python -m parity bench needs a CUDA GPU (FA3 and the Pallas kernels are timed on it, and the "
              "roofline's ceilings measured there); none here. To draw committed results: "
              "python -m parity plot parity/results/<bench>.json --png out.png")
        return 2
    import jax

    from parity import runner

    requested = args.impls or DEFAULT_IMPLS
    unknown = [i for i in requested if i not in RUNNERS]
    if unknown:
        print(f"unknown impls {unknown}; known: {sorted(RUNNERS)}", file=sys.stderr)
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
            ceilings = measure_ceilings()
            print(f"ceilings: copy {ceilings['copy_TBps']:.2f} TB/s, bf16 matmul {ceilings['matmul_TFLOPps']:.0f} "
                  f"TFLOP/s (measured now)", flush=True)
        except Exception as e:  # the bench goes on; the roofline then uses the anchors' ceilings
            ceilings = {"ceilings_error": f"{type(e).__name__}: {e}"[:400]}
            print(f"ceilings not measured ({ceilings['ceilings_error']}); the roofline uses the anchors'", flush=True)

    launch_ms = getattr(args, "launch_ms", LAUNCH_SECONDS * 1e3)
    cooldown_s = getattr(args, "cooldown", 0.0)

    def result(rows, summ=None):
        return {"grid": args.grid, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "launch_ms": launch_ms, **({"cooldown_s": cooldown_s} if cooldown_s else {}),
                "method": __doc__.split("Method")[1].split("Bytes")[0].strip(), **ceilings, "complete": summ is not None, "impls": impls, "unavailable": unavailable,
                "summary": summ, "rows": rows, **({"shard": f"{shard[0]}/{shard[1]}"} if shard else {}),
                **({"shapes": [s.name for s in shapes]} if names is not None else {})}

    def write(rows, summ=None):
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result(rows, summ), f, indent=1)

    # On a terminal, a progress bar on stderr under the row lines; elsewhere the row lines alone.
    progress = runner.Progress(len(shapes) * len(impls), enabled=runner._is_tty(sys.stderr))
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
    errors = [r for r in rows if "error" in r and not r["error"].startswith("NotImplementedError")]
    bad = [r for r in rows if r.get("check_ok") is False]
    return 1 if errors or bad else 0
