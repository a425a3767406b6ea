"""Writes the notebooks from plain cell lists (keeps them diffable and small); outputs are not stored.

    python notebooks/make_notebooks.py
"""

import pathlib

import nbformat

HERE = pathlib.Path(__file__).parent


def md(s):
    return nbformat.v4.new_markdown_cell(s.strip())


def code(s):
    return nbformat.v4.new_code_cell(s.strip())


WALKTHROUGH = [
    md("""
# 01 · Paged MLA decode on two stacks

One config, one batch, one metadata object; the torch path and the JAX path run it and agree.
Runs on a CPU with small shapes (the Pallas kernel in interpret mode); on an H200 set `SMALL = False`.
"""),
    code("""
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import numpy as np, torch, jax, jax.numpy as jnp
import mla_spec, mla_torch, mla_jax
from parity.compare import compare_out_lse
SMALL = jax.default_backend() == "cpu"
print("jax backend:", jax.default_backend(), "| torch cuda:", torch.cuda.is_available())
"""),
    md("""
## Config and batch
`MLAConfig` is frozen and validated. A batch is described plainly: KV length and new tokens per request,
and the pages each request owns. Request 1 is a speculative decode with 3 new tokens.
"""),
    code("""
config = mla_spec.MLAConfig(num_heads=16, page_size=16, dtype="float32" if SMALL else "bfloat16")
seq_lens, query_lens = [5, 40, 17], [1, 3, 2]
block_table = [[7], [1, 2, 4], [3, 5]]             # block 0 and 6 unused
md = mla_spec.build_decode_metadata(seq_lens=seq_lens, query_lens=query_lens,
                                    block_table=block_table, config=config, num_blocks=8)
md
"""),
    code("""
rng = np.random.default_rng(0)
T, H, D = md.num_decode_tokens, config.num_heads, config.head_dim
q = rng.standard_normal((T, H, D), dtype=np.float32)
kv_cache = np.full((8, config.page_size, D), np.nan, np.float32)   # NaN everywhere nobody may read
for seq_len, pages in zip(seq_lens, block_table):
    pos = np.arange(seq_len)
    kv_cache[np.array(pages)[pos // config.page_size], pos % config.page_size] = rng.standard_normal((seq_len, D))
print("NaN slots in the cache:", int(np.isnan(kv_cache).any(-1).sum()))
"""),
    md("## The definition, and both stacks"),
    code("""
ref_out, ref_lse = mla_spec.reference.mla_decode(q, kv_cache, md, config)       # float64 NumPy
t_out, t_lse = mla_torch.mla_decode(torch.from_numpy(q), torch.from_numpy(kv_cache), md, config)
j_out, j_lse = mla_jax.mla_decode(jnp.asarray(q), jnp.asarray(kv_cache), md, config, impl="xla")
for name, (o, l) in {"torch.reference": (t_out.numpy(), t_lse.numpy()),
                     "jax.xla": (np.asarray(j_out), np.asarray(j_lse))}.items():
    c_out, c_lse = compare_out_lse(o, l, ref_out, ref_lse, "float32")
    print(f"{name:16s} {c_out.message[:70]}\\n{'':16s} {c_lse.message[:70]}")
"""),
    code("""
impl = "pallas_triton"
try:
    p_out, p_lse = mla_jax.mla_decode(jnp.asarray(q), jnp.asarray(kv_cache), md, config, impl=impl)
    c_out, c_lse = compare_out_lse(np.asarray(p_out), np.asarray(p_lse), ref_out, ref_lse, "float32")
    print(impl, "interpret mode" if mla_jax.default_interpret() else "on GPU", "->", c_out.ok and c_lse.ok)
except NotImplementedError as e:
    print(impl, "cannot run here:", e)
"""),
    md("""
## What the LSE is for: merging partial attention across KV shards
With decode context parallelism each device holds a shard of every request's KV and returns a partial
`(out_i, lse_i)`. The exact result is the LSE-weighted sum: `w_i = exp(lse_i - lse)`, `lse = logsumexp_i lse_i`.
Below, request 1's KV is split into two halves (positions < 20 and >= 20); each half is attended to separately
by its last token (position 39 sees everything), then merged.
"""),
    code("""
L = config.kv_lora_rank
t = 3                                             # last token of request 1 (query_start_loc = [0, 1, 4, 6])
pos = np.arange(40)
rows = kv_cache[np.array(block_table[1])[pos // config.page_size], pos % config.page_size].astype(np.float64)
def partial(rows):
    s = config.softmax_scale * (q[t].astype(np.float64) @ rows.T)          # [H, S]
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    return np.exp(s - lse[:, None]) @ rows[:, :L], lse
(o1, l1), (o2, l2) = partial(rows[:20]), partial(rows[20:])
lse = np.logaddexp(l1, l2)
merged = np.exp(l1 - lse)[:, None] * o1 + np.exp(l2 - lse)[:, None] * o2
print("merged vs full: max |out| diff", np.abs(merged - ref_out[t]).max(), "| max |lse| diff", np.abs(lse - ref_lse[t]).max())
"""),
]

PERFORMANCE = [
    md("""
# 02 · Performance on the H200

The committed H200 results (`parity/results/h200-bench-*.json`, written by `python -m parity bench`)
against FA3 and FlashMLA: the time ratio per shape, and the roofline. Nothing is measured here: these are
the numbers the bench printed on the GPU, drawn with `parity.plots` (the same code as
`python -m parity plot RESULTS.json --png out.png`).
"""),
    code("""
import json, pathlib
from IPython.display import Image, display
import parity
from parity import plots
RESULTS = pathlib.Path(parity.__file__).parent / "results"
benches = {p.name: json.loads(p.read_text()) for p in sorted(RESULTS.glob("h200-bench-*.json"))}
def show(fig):
    display(Image(plots.png_bytes(fig, dpi=60)))   # small outputs
for name, b in benches.items():
    print(f"{name}: grid {b['grid']!r}, {len({r['name'] for r in b['rows']})} shapes, impls {b['impls']}")
"""),
    md("""
## Time ratio per shape
`FA3 time / impl time` for every shape of a bench (> 1: faster than FA3), and the same against FlashMLA
where the bench timed it. The dashed lines are each impl's geomean.
"""),
    code("""
for name, b in benches.items():
    for base in ("torch.fa3", "torch.flashmla"):
        for impl, pts in plots.speed_ratios(b, base).items():
            v = [x for _, x in pts]
            print(f"{name:38s} {base:15s}/ {impl:22s} geomean {plots.geomean(v):.3f}  "
                  f"min {min(v):.2f}  max {max(v):.2f}  ({len(v)} shapes)")
"""),
    code("""
show(plots.speedup_figure(benches["h200-bench-triton-2026-11-30.json"], against=("torch.fa3", "torch.flashmla")))
"""),
    code("""
LATEST = "h200-bench-headline-mosaic-v2-2026-11-30.json"   # FA3, FlashMLA, Triton, Mosaic GPU in one run
show(plots.speedup_figure(benches[LATEST], against=("torch.fa3",)))
"""),
    code("""
# The issue grid for the Mosaic GPU kernel (v3); that run was cut after 27 of 61 shapes
show(plots.speedup_figure(benches["h200-bench-mosaic-grid-v3-2026-11-30.json"], against=("torch.fa3",)))
"""),
    md("""
## Roofline
Achieved TFLOP/s against arithmetic intensity (FLOPs / byte; bytes = the KV cache read once + q + out),
under the machine's copy and bf16 matmul ceilings, which the bench measured in the same run.
"""),
    code("""
b = benches[LATEST]
print(b["grid"], "ceilings:", plots.ceilings(b))
show(plots.roofline_figure(b))
"""),
    md("""
## FP8 KV cache
The Triton kernel on an fp8 copy of the cache (KV bytes counted at 1 byte) against bf16 Triton and FA3:
its speed ratio, and its measured gap to FA3 on the original bf16 values (recorded, not judged).
"""),
    code("""
s = benches["h200-bench-fp8-2026-11-30.json"]["summary"]
print("time bf16 Triton / time fp8 Triton, geomean:", round(s["fp8_speedup_vs_bf16"]["geomean_speedup"], 3))
print("gap to FA3 (bf16):", {k: round(v, 4) for k, v in s["fp8_gap_vs_first"].items() if k != "shapes"})
"""),
    md("## The headline shapes"),
    code("""
b = benches[LATEST]
for shape in ("H16_B128_S16384_q1", "H128_B64_S16384_q1", "H16_B1_S1024_q1"):
    for r in plots.timed_rows(b):
        if r["name"] == shape:
            print(f"{shape:20s} {r['impl']:22s} {r['seconds'] * 1e6:8.1f} us {r['TBps']:5.2f} TB/s "
                  f"{r['TFLOPps']:6.1f} TFLOP/s")
"""),
]


def write(name, cells):
    for i, cell in enumerate(cells):  # stable ids: regenerating an unchanged notebook changes nothing
        cell["id"] = f"{name.split('_')[0]}-{i:02d}"
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    write("01_walkthrough.ipynb", WALKTHROUGH)
    write("02_performance.ipynb", PERFORMANCE)
