"""The benchmark's problem shapes: `Shape` (heads, batch, sequence length, query length, page size, dtype), its
bytes and FLOPs, the named grids of `python -m parity bench` and the shape names the tools take (H16_B64_S4096_q2)."""

from __future__ import annotations

import dataclasses
import re

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
    # the mosaic grid's H = 16, q_len 2 rows alone (32-row query tiles)
    "mosaic_h16_q2": _grid((16,), (1, 8, 32, 64, 128), (1024, 4096, 16384), (2,)),
    # the anchors' headline shapes (memory-bound, compute-bound, latency)
    "headline": [Shape(16, 128, 16384), Shape(128, 64, 16384), Shape(16, 1, 1024), Shape(128, 1, 1024),
                 Shape(16, 64, 4096, 2), Shape(128, 32, 4096)],
    "smoke": [Shape(16, 4, 1024), Shape(128, 2, 2048, 2)],
    # fp8 KV cache against bf16 (--impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8): memory-bound and mid
    "fp8": [Shape(16, 128, 16384), Shape(16, 64, 4096, 2), Shape(16, 32, 16384), Shape(128, 64, 16384),
            Shape(128, 32, 4096), Shape(16, 1, 1024), Shape(128, 1, 1024)],
    # fp8 with each request's last step masked (sequence lengths one short of a multiple of 64, as most real ones are
    # not multiples): the fp8 grid's bytes-bound rows and the 32-row ones, where a masked step shows most
    "fp8_tails": [Shape(16, 128, 16383), Shape(16, 64, 4095, 2), Shape(16, 32, 16383), Shape(32, 64, 4095),
                  Shape(16, 8, 4095), Shape(128, 64, 16383), Shape(16, 1, 1023)],
}


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


def parse_shape(name: str) -> Shape:
    """A shape from its name: H128_B64_S16384_q1 (q_len 1 where `_q` is left out; optionally `_P<page size>`)."""
    m = re.fullmatch(r"H(\d+)_B(\d+)_S(\d+)(?:_q(\d+))?(?:_P(\d+))?", name)
    if not m:
        raise ValueError(f"shape must look like H128_B64_S16384_q1 (optionally _P64), got {name!r}")
    h, b, s, q, p = m.groups()
    kw = {"page_size": int(p)} if p else {}
    return Shape(int(h), int(b), int(s), int(q or 1), **kw)
