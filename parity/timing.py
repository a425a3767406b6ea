"""How the benchmark times an implementation, shared by `python -m parity bench` and the tools (tools/sweep.py,
tools/profile.py, tools/timeline.py): the inputs of a shape, a runner per implementation, the N-call launches and
their calibration, the device trace of one launch, and the machine's roofline ceilings.

Method (the same for both stacks, so host dispatch cannot decide a ratio): N back-to-back calls per launch, timed
with a host clock around launch + device synchronize, median of several launches, divided by N (`seconds`).
  - torch (FA3, FlashMLA): N calls captured once in a CUDA graph, the graph replayed.
  - JAX (Pallas kernels): N calls inside one jitted `lax.fori_loop`, 4 per iteration, one per query buffer (4
    separate arrays, each passed through an optimization barrier with the loop index, so nothing is loop-invariant
    and nothing is copied), all 4 results carried (so nothing is dead). N is a multiple of 4.
N is chosen per shape so that an N-call launch lasts about `launch_seconds` (default 25 ms; 20 <= N <= 8000): long
enough that what a launch costs once (on the H200 the JAX loop's launches carry 0.1-0.7 ms outside their kernels)
is a small part of t(N)/N. The JAX loop's trip count is static (a traced one makes XLA read the loop predicate back
every iteration).

The device trace (`trace_launch`, `summarize`): one N-call launch under the JAX profiler (CUPTI, which sees both
stacks' kernels in one process): the kernels' summed time (`busy`) and their span from the first kernel's start to
the last one's end, per call, and the host time of the launch before its first kernel starts and after its last one
ends (`lead`, `tail`), where a launch's own cost shows.

Ceilings (`measure_ceilings`): the machine's copy rate (a 2 GiB device-to-device copy, bytes read + written) and
bf16 matmul rate (8192^3), each the median of 10 runs timed with CUDA events: the roofline is drawn under them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import glob
import math
import os
import shutil
import statistics
import tempfile
import time

from mla_spec.fp8 import fp8_k_scale
from parity.shapes import Shape, SparseShape

METHOD = __doc__.split("Method ")[1].split("\n\nThe device trace")[0].strip()
"""The method in words, as a bench result records it."""

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


# ----------------------------------------------------------------------------- inputs


@dataclasses.dataclass
class BenchInputs:
    shape: Shape
    config: object
    metadata: object  # mla_spec.DecodeMetadata (NumPy)
    q: object  # torch [4, T, H, 576] (4 rotating buffers)
    kv_cache: object  # torch [num_blocks, P, 576]
    sparse: object = None  # a sparse shape's mla_spec.SparseMetadata (torch indices on the GPU); None: dense


def shape_config(shape: Shape, **overrides):
    """The MLAConfig of a bench shape (overrides: e.g. kv_cache_dtype="fp8_e4m3")."""
    from mla_spec import MLAConfig

    return MLAConfig(num_heads=shape.num_heads, page_size=shape.page_size, dtype=shape.dtype,
                     max_num_seqs=max(256, shape.batch), **overrides)


def paged_block_table(seq_lens, page_size: int, block_ids):
    """int32 [R, max pages] block table: request r takes the next ceil(seq_lens[r] / page_size) ids of
    `block_ids` (in order, request 0 first), its row padded with block 0 past them (never read: vLLM's padding).
    `block_ids` must hold at least that many ids in all (ValueError otherwise); for a uniform batch the table is
    block_ids reshaped to [R, pages]."""
    import numpy as np

    pages = [-(-int(n) // page_size) for n in seq_lens]
    ids = np.asarray(block_ids).reshape(-1)
    if ids.shape[0] < sum(pages):
        raise ValueError(f"block_ids holds {ids.shape[0]} ids, the requests need {sum(pages)} pages")
    table = np.zeros((len(pages), max(1, max(pages))), np.int32)
    start = 0
    for r, n in enumerate(pages):
        table[r, :n] = ids[start:start + n]
        start += n
    return table


def shape_metadata(shape: Shape, config, block_ids, num_blocks: int | None = None):
    """The DecodeMetadata (NumPy) of a bench shape: its per-request seq_lens and query_lens (ragged or uniform), its
    pages at `block_ids` (`paged_block_table`; `make_inputs` passes a permutation of blocks 1..shape.num_pages),
    checked against a cache of num_blocks blocks (default len(block_ids) + 1)."""
    from mla_spec import build_decode_metadata

    block_table = paged_block_table(shape.seq_lens, shape.page_size, block_ids)
    return build_decode_metadata(seq_lens=list(shape.seq_lens), query_lens=list(shape.query_lens),
                                 block_table=block_table, config=config,
                                 num_blocks=len(block_ids) + 1 if num_blocks is None else num_blocks)


def make_inputs(shape: Shape, seed: int = 0) -> BenchInputs:
    """The bench's inputs for `shape` on the GPU (a SparseShape's: `make_sparse_inputs`): a cache of shape.num_pages + 1 random blocks (block 0 is the block
    tables' padding), the requests' pages at a random permutation of blocks 1.. (`shape_metadata`), and 4 random
    query buffers; drawn with a torch generator seeded `seed`."""
    import torch

    if isinstance(shape, SparseShape):
        return make_sparse_inputs(shape, seed)
    config = shape_config(shape)
    g = torch.Generator(device="cuda").manual_seed(seed)
    num_blocks = shape.num_pages + 1
    perm = (torch.randperm(num_blocks - 1, generator=g, device="cuda") + 1).to(torch.int32)
    md = shape_metadata(shape, config, perm.cpu().numpy())
    dt = getattr(torch, shape.dtype)
    kv = torch.randn(num_blocks, shape.page_size, config.head_dim, generator=g, device="cuda", dtype=dt)
    q = torch.randn(4, shape.num_tokens, shape.num_heads, config.head_dim, generator=g, device="cuda", dtype=dt)
    return BenchInputs(shape, config, md, q, kv)


def make_sparse_inputs(shape, seed: int = 0, device: str = "cuda") -> BenchInputs:
    """The bench's inputs for a SparseShape: a cache of shape.num_pages + 1 random blocks (block 0 unused), request
    r's pages at a random permutation of blocks 1.., and for each query token `topk` distinct positions of its
    request's cache drawn uniformly (the top-k of uniform random scores, in that random order) as global slots
    `block * page_size + offset`: the rows a token reads are scattered over the request's pages, as an indexer's
    picks over a long context are. `metadata` is the indices' SparseMetadata (torch, on `device`)."""
    import torch

    from mla_spec import SparseMetadata

    config = shape_config(shape)
    g = torch.Generator(device=device).manual_seed(seed)
    P = shape.page_size
    pages = -(-shape.seq_len // P)
    perm = (torch.randperm(shape.num_pages, generator=g, device=device) + 1).reshape(shape.batch, pages)
    scores = torch.rand(shape.num_tokens, shape.seq_len, generator=g, device=device)
    positions = scores.topk(shape.topk, dim=1).indices  # [T, topk] distinct positions of the token's request
    request = (torch.arange(shape.num_tokens, device=device) // shape.q_len)[:, None]
    indices = (perm[request, positions // P] * P + positions % P).to(torch.int32)
    dt = getattr(torch, shape.dtype)
    kv = torch.randn(shape.num_pages + 1, P, config.head_dim, generator=g, device=device, dtype=dt)
    q = torch.randn(4, shape.num_tokens, shape.num_heads, config.head_dim, generator=g, device=device, dtype=dt)
    md = SparseMetadata(indices=indices)
    return BenchInputs(shape, config, md, q, kv, sparse=md)


def quantize_fp8(kv_cache):
    """(kv_fp8, k_scale): a torch cache (finite values, any float dtype and device) quantized to
    float8_e4m3fn by the cache's rule (`mla_spec.fp8`, `mla_torch.quantize_fp8`) with one per-tensor scale
    k_scale = amax(|kv|) / 448 (a float32 value, returned as a Python float; 1.0 for an all-zero cache),
    vLLM's convention: real value = fp8 value * k_scale."""
    import mla_torch

    k_scale = fp8_k_scale(float(kv_cache.abs().amax().float()))
    return mla_torch.quantize_fp8(kv_cache, k_scale), k_scale


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
        # does ("operation failed due to a previous error during capture")
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for i in range(n):
                fn(q[i % 4])

        def run(_inputs=(fn, q)):
            # _inputs: the graph reads what fn and q hold (FA3's metadata, FlashMLA's block table...) at
            # their captured addresses; this reference keeps them alive after the caller drops fn, so that
            # a later torch allocation (quantize_fp8's copy) cannot overwrite them (an illegal address or a
            # hang at the next replay)
            graph.replay()
            torch.cuda.synchronize()

        return run

    return time_n


def torch_sparse(inp: BenchInputs, impl: str):
    """A sparse shape's torch runner: "fa3" (vLLM's FA3 path over one-token pages, the bf16 cache) or "flashmla"
    (FlashMLA's sparse fp8 decode on the cache quantized to the fp8_ds_mla layout, its schedule built once, outside
    the timed calls, as vLLM builds it once a step for every layer)."""
    import mla_torch
    from mla_torch import flashmla
    from mla_torch.fa3 import sparse as fa3_sparse

    md = inp.sparse
    if impl == "fa3":
        reason = fa3_sparse.unsupported_reason(inp.config, inp.kv_cache.device)
        if reason is not None:
            raise NotImplementedError(reason)

        def fn(q):
            return fa3_sparse.sparse_mla_decode(q, inp.kv_cache, md.indices, md.topk_length, inp.config)
    else:
        reason = flashmla.unsupported_reason(inp.config, inp.kv_cache.device)
        if reason is not None:
            raise NotImplementedError(reason)
        kv = mla_torch.quantize_sparse_fp8(inp.kv_cache)
        schedule = flashmla.flashmla_interface().get_mla_metadata()

        def fn(q):
            return flashmla.sparse_mla_decode(q, kv, md.indices, md.topk_length, inp.config, schedule=schedule)

    fn(inp.q[0])  # (FlashMLA: the first call fills the schedule; later calls and the graph reuse it)
    return (lambda: fn(inp.q[0])), _torch_graph_timer(fn, inp.q)


def torch_fa3(inp: BenchInputs):
    if inp.sparse is not None:
        return torch_sparse(inp, "fa3")
    from mla_torch import fa3

    device = inp.kv_cache.device
    builder = fa3.FlashAttnMLAMetadataBuilder(inp.config, device)  # eager mode: FA3's own split heuristic
    attn_md = builder.build(inp.metadata, num_blocks=int(inp.kv_cache.shape[0]))
    impl = fa3.FlashAttnMLAImpl.from_config(inp.config, device)

    def fn(q):
        return impl._forward_decode(q, inp.kv_cache, attn_md)

    return (lambda: fn(inp.q[0])), _torch_graph_timer(fn, inp.q)


def torch_flashmla(inp: BenchInputs):
    if inp.sparse is not None:
        return torch_sparse(inp, "flashmla")
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


def jax_kernel(impl: str, tuning=None, fp8: bool = False, interpret: bool = False):
    """A runner for mla_jax.<impl>.mla_decode; with fp8, on the cache quantized by quantize_fp8
    (kv_cache_dtype="fp8_e4m3") and its k_scale passed traced. interpret: Pallas interpret mode, on
    any device (the CPU tests of this runner; never timed). tuning: the kernel's tuning (None: its heuristic's pick
    for each shape)."""

    def make(inp: BenchInputs):
        import importlib

        import jax
        import jax.numpy as jnp
        from jax import lax

        import mla_jax

        if inp.sparse is not None:
            return _jax_sparse(impl, inp, fp8, interpret)
        mod = importlib.import_module(f"mla_jax.{impl}")
        config = inp.config.replace(kv_cache_dtype="fp8_e4m3") if fp8 else inp.config
        reason = mod.unsupported_reason(config, None if interpret else jax.devices()[0])
        if reason is not None:
            raise NotImplementedError(reason)
        md = mla_jax.to_jax_metadata(inp.metadata)
        if hasattr(mod, "with_schedule"):  # the work schedule once a batch, outside the timed calls (as FA3's)
            md = mod.with_schedule(md, config, num_tokens=inp.q.shape[1], tuning=tuning)
        q = jax.dlpack.from_dlpack(inp.q)
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
                return mod.mla_decode(qi, None, kv, md, config, tuning=tuning, k_scale=scale, **extra)
            return mod.mla_decode(qi, None, kv, md, config, tuning=tuning, **extra)

        return _jax_runner(call, q, kv, md, scale)

    return make


def jax_time_n(call, qs, *args):
    """n -> a callable that runs n calls of call(q_i, *args), cycling over the buffers qs, in one jitted
    `timed_loop`, and waits for them (n a multiple of len(qs))."""
    import jax

    loop = functools.partial(jax.jit, static_argnums=(0, 1))(timed_loop)

    def time_n(n):
        if n % len(qs):
            raise ValueError(f"n must be a multiple of {len(qs)}, got {n=}")
        return lambda: jax.block_until_ready(loop(call, n, qs, *args))

    return time_n


def _jax_runner(call, q, *args):
    """(call_once, time_n) of a JAX runner: call(q_i, *args) -> (out, lse) jitted once, and n of them in one jitted
    `timed_loop` over q's 4 buffers (sliced once, outside the loop; jax_time_n)."""
    import jax

    once = jax.jit(call)
    qs = tuple(q[k] for k in range(q.shape[0]))
    return (lambda: jax.block_until_ready(once(qs[0], *args))), jax_time_n(call, qs, *args)


def _jax_sparse(impl: str, inp: BenchInputs, fp8: bool, interpret: bool):
    """jax_kernel's runner on a sparse shape: mla_jax.sparse_mla_decode(impl=...) on the bf16 cache, or with fp8
    on the cache quantized to the fp8_ds_mla layout (mla_torch.quantize_sparse_fp8); the indices traced."""
    import jax

    import mla_jax
    import mla_torch
    from mla_spec import SparseMetadata

    cache_format = "fp8_ds_mla" if fp8 else "auto"
    if impl not in mla_jax.SPARSE_IMPLS:
        raise NotImplementedError(f"mla_jax has no sparse impl {impl!r} (it has {mla_jax.SPARSE_IMPLS})")
    reason = mla_jax.sparse_unsupported_reason(impl, inp.config, None if interpret else jax.devices()[0],
                                               cache_format=cache_format)
    if reason is not None:
        raise NotImplementedError(reason)
    kv = jax.dlpack.from_dlpack(mla_torch.quantize_sparse_fp8(inp.kv_cache) if fp8 else inp.kv_cache)
    md = SparseMetadata(indices=jax.dlpack.from_dlpack(inp.sparse.indices))
    q = jax.dlpack.from_dlpack(inp.q)
    extra = {"interpret": True} if interpret and impl != "xla" else {}

    def call(qi, kv, md):  # (the fp8_ds_mla layout carries its own scales: no k_scale)
        return mla_jax.sparse_mla_decode(qi, kv, md, inp.config, impl=impl, cache_format=cache_format, **extra)

    return _jax_runner(call, q, kv, md)


RUNNERS = {
    "torch.fa3": torch_fa3,
    "torch.flashmla": torch_flashmla,
    "jax.pallas_triton": jax_kernel("pallas_triton"),
    "jax.pallas_mosaic_gpu": jax_kernel("pallas_mosaic_gpu"),
    "jax.pallas_triton.fp8": jax_kernel("pallas_triton", fp8=True),
    "jax.pallas_mosaic_gpu.fp8": jax_kernel("pallas_mosaic_gpu", fp8=True),
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


# ----------------------------------------------------------------------------- device trace


def device_events(profile) -> list[tuple[str, float, float]]:
    """(name, start_ns, duration_ns) of every event on a device plane ("/device:GPU:*") of a
    jax.profiler.ProfileData, from its stream lines (not the summary lines XLA adds)."""
    events = []
    for plane in profile.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for e in line.events:
                events.append((e.name, float(e.start_ns), float(e.duration_ns)))
    return events


LAUNCH = "parity.timing.launch"  # the host-side annotation around the traced launch


def launch_window(profile) -> tuple[float, float] | None:
    """(start_ns, end_ns) of the LAUNCH annotation on a host plane (the same clock as the device events)."""
    for plane in profile.planes:
        if plane.name.startswith("/device"):
            continue
        for line in plane.lines:
            for e in line.events:
                if e.name == LAUNCH:
                    return float(e.start_ns), float(e.start_ns + e.duration_ns)
    return None


def summarize(events, n_calls: int, window: tuple[float, float] | None = None) -> dict:
    """busy (summed kernel time), span (first start to last end) and kernel means, per call, in us; with the
    launch's host window, also what the launch spends before its first kernel starts (lead_us) and after its
    last one ends (tail_us), per launch, in us."""
    if not events:
        return dict(kernels=0)
    start = min(s for _, s, _ in events)
    end = max(s + d for _, s, d in events)
    busy = sum(d for _, _, d in events)
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for name, _, d in events:
        by_name[name][0] += 1
        by_name[name][1] += d
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:6]
    out = dict(kernels=len(events), busy_us=busy / n_calls / 1e3, span_us=(end - start) / n_calls / 1e3,
               busy_share=busy / max(end - start, 1.0),
               top=[dict(name=k[:80], per_call=c / n_calls, us_per_call=t / n_calls / 1e3) for k, (c, t) in top])
    if window is not None:
        out.update(lead_us=(start - window[0]) / 1e3, tail_us=(window[1] - end) / 1e3)
    return out


def trace_launch(run):
    """(device events, the launch's host window or None) of one run(), traced with the JAX profiler."""
    import jax
    from jax.profiler import ProfileData

    d = tempfile.mkdtemp(prefix="parity-timing-")
    try:
        jax.profiler.start_trace(d)
        with jax.profiler.TraceAnnotation(LAUNCH):
            run()
        jax.profiler.stop_trace()
        [path] = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        profile = ProfileData.from_file(path)
        return device_events(profile), launch_window(profile)
    finally:
        shutil.rmtree(d, ignore_errors=True)
