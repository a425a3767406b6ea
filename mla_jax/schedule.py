"""The split-KV work schedule of a ragged decode batch, computed on the device from the actual lengths.

Model: FlashMLA's `get_mla_metadata` (a per-CTA table of begin/end (request, position) plus cumulative split
counts per request). Here the schedule is computed with jnp from traced `seq_lens` and `query_lens` inside the
jitted call, so a batch with new lengths reuses the compiled program: the shapes depend only on the number of
requests R and the static arguments.

Work units. Request r has n_r = ceil(seq_lens[r] / block_kv) steps of `block_kv` KV positions, 0 for padding
(seq_len 0 or q_len 0). The steps of all requests, request after request, form one linear order; global step
index g runs over [0, N), request r owning [N_r, N_r + n_r). A *part* (one CTA's work list: the kernel's grid has
num_parts of them per head tile and query tile) covers a contiguous range [g_p, g_{p+1}) of that order. Its
*pieces* are the maximal runs of its steps inside one request (and, in batch-invariant mode, inside one chunk of
`chunk_steps` steps of that request). Each piece writes one partial (out normalized over its steps, lse) to its own
*slot*; request r's pieces own consecutive slots [split_offsets[r], split_offsets[r + 1]), in step order, and the
combine merges them by LSE.

Cost. A piece costs its steps plus `fixed_overhead` (FlashMLA charges 5 blocks: loading q, the epilogue, the
partial's write and its share of the combine). A request's cost on its own is W_r = n_r + O (0 for padding).

Balanced mode (chunk_steps None). Lay the requests on a cost line, request r on [C_r, C_r + W_r): first its O
overhead units, then step s at point C_r + O + s. Total W = sum W_r. Part p's cost interval is [x_p, x_{p+1}) with
x_p = floor(p W / P), and the part takes exactly the steps whose point lies in its interval. Every step has one
point in one interval, so every step of every request is covered exactly once, by construction. A cut x maps to the
global step g(x) = N_r + clip(x - C_r - O, 0, n_r) of the request r whose interval holds x. With O = 0 (the Mosaic
GPU kernel's schedule, a piece a CTA) the cost line is the step line, g_p = x_p = floor(p N / P), except that a cut
inside a request of at most ceil(N / P) steps moves to that request's nearer end (`_snapped_cuts`: such a request
is one piece, not two with fp32 partials to merge), and the pieces are the segments between those cuts and the
requests' first steps: `_equal_steps` builds them with the table. The moved cuts keep every step covered once (they
stay sorted) and move at most ceil(N / P) // 2 steps each, so a part's cost is within 2 (ceil(N / P) // 2) of its
unmoved length (the balance bound below, at O = 0); a piece is at most ceil(N / P) steps either way.

    Balance bound: part p's real cost (its steps + O per piece) is len_p + a_p - b_p with len_p = x_{p+1} - x_p
    in {floor(W/P), ceil(W/P)}, a_p in [0, O] the overhead of its first piece lying before x_p (O when that piece
    continues a request, else the overhead units before the cut) and b_p in [0, O] the overhead units at its end
    that belong to a request whose first step lies in the next part. So |cost_p - len_p| <= O, every part costs at
    most ceil(W/P) + O (FlashMLA's payload bound: the makespan is within O of the ideal) and two parts differ by at
    most 2 O + 1.

    Slot bound: request r's pieces number 1 + (distinct cuts g_p strictly inside r's steps). There are P - 1
    inner cuts, so the batch has at most R + P - 1 pieces: `num_slots = R + P - 1`, a static size.

Batch-invariant mode (chunk_steps C). Request r is cut into pieces of C steps (the last one shorter) at multiples of
C of its own steps, whatever else is in the batch; pieces are atomic units of cost (steps + O), laid on the cost
line in order, and part p takes the pieces whose start lies in [x_p, x_{p+1}). A piece's partial therefore depends
only on its request, and merging a request's slots in order is independent of the batch. Each part's cost is within
C + O of len_p. Slot bound: sum_r ceil(n_r / C) <= R * ceil(max_steps / C) = `num_slots`, with `max_steps` static
(ceil(max_seq_len / block_kv) of the bucket). max_steps must bound every request's steps: under jit that cannot be
checked, and pieces past num_slots would be lost (`reference_schedule` raises ValueError there).

Layout (what a kernel reads): `table` int32 [P, 8], one row per part, a few scalar loads per CTA:

    0 BEGIN_REQ    request of the part's first step          (0 for an empty part)
    1 BEGIN_STEP   that step's index inside its request       (0 for an empty part)
    2 END_REQ      request of the part's last step (inclusive) (0 for an empty part)
    3 END_STEP     one past the last step, inside END_REQ      (0 for an empty part)
    4 FIRST_SLOT   slot of the part's first piece; later pieces take the next slots in order
    5 NUM_PIECES   pieces (partials) the part writes
    6 NUM_STEPS    steps the part covers (0: an empty part, which the CTA skips)
    7 COST         NUM_STEPS + fixed_overhead * NUM_PIECES

and `split_offsets` int32 [R + 1]: request r's slots are [split_offsets[r], split_offsets[r + 1]) (empty for
padding); split_offsets[R] is the number of slots used (<= num_slots). The combine reads them per token:
`token_slots` int32 [T, 3] (`slot_ranges`), token t's (first slot, slot count, index inside its request) for a
bucket of T tokens. A kernel module's `with_schedule` builds it with the schedule, once a batch, so that no call
spends its small XLA kernels on it.

The walk (what `pieces` does, and what a CTA of part p runs): if NUM_STEPS == 0, write nothing. Else slot =
FIRST_SLOT; for r in BEGIN_REQ..END_REQ: lo = BEGIN_STEP if r == BEGIN_REQ else 0, hi = END_STEP if r == END_REQ
else n_r (padding requests in between have n_r = 0 and give no piece); while lo < hi: stop = hi, or in batch-invariant
mode min(hi, the next multiple of chunk_steps); run steps [lo, stop) of request r (KV positions [lo * block_kv,
min(stop * block_kv, seq_len)), the request's q_len tokens, bottom-right causal), write out and lse to `slot`;
slot += 1, lo = stop. The combine then merges, for each token of request r, the slots [split_offsets[r],
split_offsets[r + 1]) by LSE (`combine_slots`); a partial buffer of [num_slots, max_query_len, H, L] float32 and
[num_slots, max_query_len, H] suffices, since a slot belongs to one request.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

BEGIN_REQ, BEGIN_STEP, END_REQ, END_STEP, FIRST_SLOT, NUM_PIECES, NUM_STEPS, COST = range(8)
TABLE_COLUMNS = 8

DEFAULT_BLOCK_KV = 64
DEFAULT_FIXED_OVERHEAD = 5  # FlashMLA's fixed_overhead_num_blocks


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A work schedule (see the module docstring). table [P, 8] and split_offsets [R + 1] are int32 leaves, and
    token_slots [T, 3] (`slot_ranges` of a bucket of T tokens) when the schedule was built for one
    (`with_token_slots`; None: the combine computes it in the call), pieces [num_slots, 3] (`slot_pieces`'s rows,
    which mla_schedule gives at fixed_overhead 0; None: a kernel that reads them computes them), and kernel_rows, a
    tuple of arrays a kernel builds from the schedule and the batch once a batch (the Mosaic GPU kernel's rows of its
    requests and pieces; None: built in the call); the ints are static: num_slots (the partial buffer's slot count),
    block_kv, fixed_overhead, chunk_steps (0 in balanced mode)."""

    table: Any
    split_offsets: Any
    num_slots: int
    block_kv: int
    fixed_overhead: int
    chunk_steps: int = 0
    token_slots: Any = None
    pieces: Any = None
    kernel_rows: Any = None

    def with_token_slots(self, query_start_loc, num_tokens: int) -> "Schedule":
        """This schedule with token_slots for a bucket of num_tokens tokens (`slot_ranges`)."""
        return dataclasses.replace(self, token_slots=slot_ranges(self.split_offsets, query_start_loc, num_tokens))

    @property
    def num_parts(self) -> int:
        return int(self.table.shape[0])

    @property
    def num_reqs(self) -> int:
        return int(self.split_offsets.shape[0]) - 1


jax.tree_util.register_dataclass(
    Schedule,
    data_fields=["table", "split_offsets", "token_slots", "pieces", "kernel_rows"],
    meta_fields=["num_slots", "block_kv", "fixed_overhead", "chunk_steps"],
)


def check_static_args(num_parts, block_kv, fixed_overhead, chunk_steps, max_steps) -> None:
    """Raises ValueError naming the first bad static argument."""
    for name, value, lo in (("num_parts", num_parts, 1), ("block_kv", block_kv, 1),
                            ("fixed_overhead", fixed_overhead, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {name}={value!r}")
    if block_kv & (block_kv - 1):
        raise ValueError(f"block_kv must be a positive power of two, got block_kv={block_kv}")
    if chunk_steps is None:
        return
    for name, value in (("chunk_steps", chunk_steps), ("max_steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an int >= 1 in batch-invariant mode, got {name}={value!r}")


def num_slots_bound(num_reqs: int, num_parts: int, chunk_steps: int | None = None, max_steps: int = 0) -> int:
    """The static slot count: R + P - 1 balanced, R * ceil(max_steps / chunk_steps) batch-invariant."""
    if chunk_steps is None:
        return num_reqs + num_parts - 1
    return num_reqs * -(-max_steps // chunk_steps)


def request_steps(seq_lens, query_lens, block_kv: int):
    """n_r: ceil(seq_len / block_kv) steps per request, 0 for padding (seq_len 0 or q_len 0). int32 [R]."""
    seq = jnp.asarray(seq_lens, jnp.int32)
    live = (seq > 0) & (jnp.asarray(query_lens, jnp.int32) > 0)
    return jnp.where(live, (seq + block_kv - 1) // block_kv, 0)


def searchsorted(a, v, side: str):
    """jnp.searchsorted(a, v, side) as straight-line code: 'compare_all', a [len(v), len(a)] compare and count (18
    StableHLO ops a call, where the unrolled binary search, 'scan_unrolled', takes 68 at 4 x 9 and 136 at 64 x 128;
    O(len(v) len(a)) work, 1M compares at 4096 tokens x 256 requests). Its default method is a `while` loop of
    log2(len(a)) iterations, and XLA on the GPU drives such a loop from the host, reading its predicate back on every
    iteration: that cost about 20 us a decode call on an H100 (slot_ranges inside the timed call), more than the
    combine kernel."""
    return jnp.searchsorted(a, v, side=side, method="compare_all")


def slot_ranges(split_offsets, query_start_loc, num_tokens: int):
    """Per token t: (its request's first slot, the request's slot count, t's index inside its request) as int32
    [T, 3]. Tokens past query_start_loc[-1] (a padded bucket's rows) get 0 slots."""
    qsl = jnp.asarray(query_start_loc, jnp.int32)
    offsets = jnp.asarray(split_offsets, jnp.int32)
    num_reqs = qsl.shape[0] - 1
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    req = jnp.minimum(searchsorted(qsl[1:], t, side="right").astype(jnp.int32), num_reqs - 1)
    inside = (t >= qsl[req]) & (t < qsl[req + 1])
    first = offsets[req]
    count = jnp.where(inside, offsets[req + 1] - first, 0)
    return jnp.stack([first, count, jnp.where(inside, t - qsl[req], 0)], axis=1)


def _exclusive_cumsum(x):
    return jnp.concatenate([jnp.zeros((1,), x.dtype), jnp.cumsum(x)])


def _cost_cuts(total, num_parts: int):
    """x_p = floor(p * total / P) for p = 0..P, as p * (total // P) + p * (total % P) // P: no int32 product of p
    and total (which would pass 2**31 for a 16M-step batch over 132 parts)."""
    p = jnp.arange(num_parts + 1, dtype=jnp.int32)
    return p * (total // num_parts) + (p * (total % num_parts)) // num_parts


def _balanced_cuts(n, num_parts: int, fixed_overhead: int):
    """g [P + 1]: part p covers global steps [g_p, g_{p+1}) (the cost-line cut of the module docstring)."""
    w = jnp.where(n > 0, n + fixed_overhead, 0)
    c = _exclusive_cumsum(w)  # [R + 1]: request r on [c_r, c_{r+1})
    n_start = _exclusive_cumsum(n)
    total = c[-1]
    x = _cost_cuts(total, num_parts)
    r = jnp.minimum(searchsorted(c[1:], x, side="right"), n.shape[0] - 1)  # the request whose interval holds x
    g = n_start[r] + jnp.clip(x - c[r] - fixed_overhead, 0, n[r])
    return jnp.where(x >= total, n_start[-1], g).astype(jnp.int32)


def _chunk_pieces(n, chunk_steps: int, num_slots: int):
    """The batch-invariant pieces, one per slot k < num_slots: (request [S], first step [S], steps [S] (0 past the
    last piece), split_offsets [R + 1])."""
    per_req = (n + chunk_steps - 1) // chunk_steps
    offsets = _exclusive_cumsum(per_req).astype(jnp.int32)
    k = jnp.arange(num_slots, dtype=jnp.int32)
    req = jnp.minimum(searchsorted(offsets[1:], k, side="right"), n.shape[0] - 1).astype(jnp.int32)
    first = (k - offsets[req]) * chunk_steps
    steps = jnp.where(k < offsets[-1], jnp.clip(n[req] - first, 0, chunk_steps), 0)
    return req, first, steps, offsets


def _invariant_cuts(n, num_parts: int, fixed_overhead: int, chunk_steps: int, num_slots: int):
    """(g [P + 1], first piece of each part k [P + 1], split_offsets [R + 1]): part p takes pieces [k_p, k_{p+1}),
    those whose start on the cost line lies in [x_p, x_{p+1})."""
    req, first, steps, offsets = _chunk_pieces(n, chunk_steps, num_slots)
    cost = jnp.where(steps > 0, steps + fixed_overhead, 0)
    start = _exclusive_cumsum(cost)  # [S + 1]
    total = start[-1]
    x = _cost_cuts(total, num_parts)
    used = offsets[-1]
    kp = jnp.minimum(searchsorted(start[:-1], x, side="left"), used).astype(jnp.int32)
    n_start = _exclusive_cumsum(n)
    piece_g = n_start[req] + first  # global first step of each piece
    g = jnp.where(kp < used, piece_g[jnp.minimum(kp, num_slots - 1)], n_start[-1])
    return g.astype(jnp.int32), kp, offsets


def _table(n, g, fixed_overhead: int, first_slot, num_pieces):
    """The [P, 8] table from the cuts g [P + 1] and the per-part slot columns."""
    n_start = _exclusive_cumsum(n)
    num_reqs = n.shape[0]
    begin, end = g[:-1], g[1:]
    nonempty = end > begin
    b_req = jnp.minimum(searchsorted(n_start[1:], begin, side="right"), num_reqs - 1)
    e_req = jnp.minimum(searchsorted(n_start[1:], end - 1, side="right"), num_reqs - 1)
    cols = [b_req, begin - n_start[b_req], e_req, end - n_start[e_req]]
    cols = [jnp.where(nonempty, col, 0) for col in cols]
    steps = end - begin
    cols += [first_slot, num_pieces, steps, steps + fixed_overhead * num_pieces]
    return jnp.stack([col.astype(jnp.int32) for col in cols], axis=1)


def _balanced_slots(n, g):
    """(first_slot [P], num_pieces [P], split_offsets [R + 1]) of the balanced schedule: a request's pieces are 1 +
    its distinct inner cuts."""
    n_start = _exclusive_cumsum(n)
    inner = g[1:-1]
    req = jnp.minimum(searchsorted(n_start[1:], inner, side="right"), n.shape[0] - 1)
    distinct = inner != g[:-2]
    is_inner = distinct & (inner > n_start[req]) & (inner < n_start[req] + n[req])
    per_req = (n > 0).astype(jnp.int32) + jax.ops.segment_sum(is_inner.astype(jnp.int32), req,
                                                              num_segments=n.shape[0])
    offsets = _exclusive_cumsum(per_req).astype(jnp.int32)
    live_before = _exclusive_cumsum((n > 0).astype(jnp.int32))  # live requests before r
    begin, end = g[:-1], g[1:]
    b_req = searchsorted(n_start[1:], begin, side="right")
    e_req = searchsorted(n_start[1:], end - 1, side="right")
    pieces = jnp.where(end > begin, live_before[jnp.minimum(e_req + 1, n.shape[0])] - live_before[b_req], 0)
    first_slot = _exclusive_cumsum(pieces)[:-1]
    return first_slot.astype(jnp.int32), pieces.astype(jnp.int32), offsets


def _segment_pieces(n_start, g, num_slots: int):
    """(pieces [S, 3], first step [S], used [S]): the non-empty segments of the global step line cut at every
    request's first step (n_start [R + 1]) and at every part's cut (g, sorted), in order, a slot each, as
    slot_pieces's rows (request, first step, one past the last inside it; zeros past the last), with each slot's
    global first step and whether it holds a segment (the two sorted lists merged: an element's place is its index
    plus the count before it in the other; no sort)."""
    pos_n = jnp.arange(n_start.shape[0], dtype=jnp.int32) + searchsorted(g, n_start, side="left")
    pos_g = jnp.arange(g.shape[0], dtype=jnp.int32) + searchsorted(n_start, g, side="right")
    cuts = jnp.zeros(n_start.shape[0] + g.shape[0] + 1, jnp.int32).at[pos_n].set(n_start).at[pos_g].set(g)[:-1]
    seg_lo, seg_hi = cuts[:-1], cuts[1:]
    live = seg_hi > seg_lo
    k = jnp.where(live, jnp.cumsum(live.astype(jnp.int32)) - 1, num_slots)  # the segment's slot
    lo = jnp.zeros(num_slots + 1, jnp.int32).at[k].set(seg_lo)[:-1]
    hi = jnp.zeros(num_slots + 1, jnp.int32).at[k].set(seg_hi)[:-1]
    used = jnp.arange(num_slots) < jnp.sum(live.astype(jnp.int32))
    req = jnp.minimum(searchsorted(n_start[1:], lo, side="right"), n_start.shape[0] - 2).astype(jnp.int32)
    rows = (req, lo - n_start[req], hi - n_start[req])
    return jnp.stack([jnp.where(used, x, 0).astype(jnp.int32) for x in rows], axis=1), lo, used


def _snapped_cuts(n_start, num_parts: int):
    """g [P + 1]: the cuts floor(p N / P) of the N steps (n_start [R + 1]: the requests' first steps), each one that
    falls inside a request of at most ceil(N / P) steps moved to that request's nearer end (its first step on a
    tie). Such a request fits one piece; cut, it would write its tokens' fp32 partials twice over and read them back
    in the combine (at q_len 3 and 16 heads 98 KB a piece, a fifth of the KV an 8-step piece reads). A cut moves
    inside its request only, and at most one cut falls inside a request that short, so g stays sorted (two cuts may
    meet: an empty part); pieces stay at most ceil(N / P) steps, and a request longer than that is cut where it was.
    A uniform batch keeps its cuts (its requests are either longer than ceil(N / P) or cut at their ends)."""
    total = n_start[-1]
    g = _cost_cuts(total, num_parts)
    longest = total // num_parts + (total % num_parts > 0).astype(jnp.int32)
    r = jnp.minimum(searchsorted(n_start[1:], g, side="right"), n_start.shape[0] - 2)
    lo, hi = n_start[r], n_start[r + 1]
    inside = (g > lo) & (g < hi) & (hi - lo <= longest)
    return jnp.where(inside, jnp.where(g - lo <= hi - g, lo, hi), g).astype(jnp.int32)


def _equal_steps(n, num_parts: int, num_slots: int):
    """(table [P, 8], split_offsets [R + 1], pieces [S, 3]) of the balanced schedule without per-piece overhead
    (fixed_overhead 0, the Mosaic GPU kernel's: a piece is a CTA of its own): the cost line is the step line, so
    the cuts are those of the N steps themselves (`_snapped_cuts`: floor(p N / P), kept off the requests that fit
    one piece) and the pieces its segments between those cuts and the requests' first steps, from one merge of the
    two sorted cut lists (each Mosaic GPU decode call builds it, unless with_schedule did: the general path,
    _balanced_cuts / _balanced_slots / _table then slot_pieces, lowers to 1.5x the StableHLO and compiles 1.8x
    slower at 6 requests x 24 parts)."""
    n_start = _exclusive_cumsum(n).astype(jnp.int32)
    g = _snapped_cuts(n_start, num_parts)
    pieces, lo, used = _segment_pieces(n_start, g, num_slots)
    # slot k's first step, past every cut for an unused slot: a request's (a part's) slots are those that start
    # before the next request's first step (the next part's cut)
    key = jnp.where(used, lo, jnp.iinfo(jnp.int32).max)
    offsets = searchsorted(key, n_start, side="left").astype(jnp.int32)
    slot_at_cut = searchsorted(key, g, side="left").astype(jnp.int32)  # [P + 1]
    steps = g[1:] - g[:-1]
    nonempty = steps > 0
    first_slot = slot_at_cut[:-1]
    num_pieces = jnp.where(nonempty, slot_at_cut[1:] - first_slot, 0)
    last = jnp.maximum(slot_at_cut[1:] - 1, 0)
    cols = [pieces[first_slot, 0], pieces[first_slot, 1], pieces[last, 0], pieces[last, 2]]
    cols = [jnp.where(nonempty, col, 0) for col in cols] + [first_slot, num_pieces, steps, steps]
    return jnp.stack([col.astype(jnp.int32) for col in cols], axis=1), offsets, pieces


def slot_pieces(schedule: Schedule, seq_lens, query_lens):
    """Each slot's piece as int32 [num_slots, 3]: (request, first step, one past its last step), in the order of
    the slots (request after request, each request's pieces in step order); (0, 0, 0) for a slot past the batch's
    last piece. A kernel that gives each piece its own CTA (the Mosaic GPU kernel) reads this rather than walking
    the table. jnp only, jit-safe: the same pieces as `pieces` walks from the table.

    Balanced: the pieces are the non-empty segments of the global step line cut at every request's first step and
    at every part's cut, in order (the two sorted cut lists merged, no sort). Batch-invariant: the chunks of
    _chunk_pieces."""
    n = request_steps(seq_lens, query_lens, schedule.block_kv)
    if schedule.chunk_steps:
        req, first, steps, _ = _chunk_pieces(n, schedule.chunk_steps, schedule.num_slots)
        return jnp.stack([jnp.where(steps > 0, x, 0).astype(jnp.int32) for x in (req, first, first + steps)], axis=1)
    n_start = _exclusive_cumsum(n).astype(jnp.int32)  # [R + 1]
    t = schedule.table
    # the parts' cuts g [P + 1] (an empty part's cut: the end of the step line)
    begin = n_start[t[:, BEGIN_REQ]] + t[:, BEGIN_STEP]
    g = jnp.concatenate([jnp.where(t[:, NUM_STEPS] > 0, begin, n_start[-1]), n_start[-1:]])
    g = jax.lax.cummin(g, reverse=True)  # (an empty part among non-empty ones: the next part's cut)
    return _segment_pieces(n_start, g, schedule.num_slots)[0]


def mla_schedule(seq_lens, query_lens, *, num_parts: int, block_kv: int = DEFAULT_BLOCK_KV,
                 fixed_overhead: int = DEFAULT_FIXED_OVERHEAD, chunk_steps: int | None = None,
                 max_steps: int | None = None) -> Schedule:
    """The schedule of a batch (seq_lens, query_lens: int32 [R], traced or concrete) over `num_parts` parts.

    chunk_steps: None for the balanced schedule; an int for batch-invariant pieces of chunk_steps steps, which
    needs max_steps (static: the bucket's ceil(max_seq_len / block_kv)) to size the slots. jnp only, jit-safe."""
    check_static_args(num_parts, block_kv, fixed_overhead, chunk_steps, max_steps)
    n = request_steps(seq_lens, query_lens, block_kv)
    num_slots = num_slots_bound(n.shape[0], num_parts, chunk_steps, max_steps or 0)
    if chunk_steps is None and fixed_overhead == 0:
        num_slots = max(num_slots, 1)
        table, offsets, pieces = _equal_steps(n, num_parts, num_slots)
        return Schedule(table, offsets, num_slots, block_kv, 0, 0, pieces=pieces)
    if chunk_steps is None:
        g = _balanced_cuts(n, num_parts, fixed_overhead)
        first_slot, pieces, offsets = _balanced_slots(n, g)
    else:
        g, kp, offsets = _invariant_cuts(n, num_parts, fixed_overhead, chunk_steps, max(num_slots, 1))
        first_slot, pieces = kp[:-1], kp[1:] - kp[:-1]
    table = _table(n, g, fixed_overhead, first_slot, pieces)
    return Schedule(table, offsets, max(num_slots, 1), block_kv, fixed_overhead, chunk_steps or 0)


def schedule_for_metadata(metadata, *, num_parts: int, block_kv: int = DEFAULT_BLOCK_KV,
                          fixed_overhead: int = DEFAULT_FIXED_OVERHEAD, chunk_steps: int | None = None) -> Schedule:
    """mla_schedule of a DecodeMetadata's batch; max_steps from its static max_seq_len."""
    qsl = jnp.asarray(metadata.query_start_loc, jnp.int32)
    max_steps = -(-metadata.max_seq_len // block_kv)
    return mla_schedule_jit(metadata.seq_lens, qsl[1:] - qsl[:-1], num_parts=num_parts, block_kv=block_kv,
                        fixed_overhead=fixed_overhead, chunk_steps=chunk_steps, max_steps=max_steps)


def prebuilt_or_build(metadata, build, *, num_parts: int, block_kv: int, chunk_steps: int | None = None,
                      num_tokens: int | None = None, fixed_overhead: int | None = None) -> Schedule:
    """The schedule a kernel's call walks: `metadata.scheduler_metadata` when it holds a Schedule (built ahead, once
    a batch, by the kernel module's with_schedule and shared by every layer's call, as FA3's scheduler_metadata and
    FlashMLA's get_mla_metadata are), else `build()` (inside the call, from the traced lengths: a few dozen small XLA
    ops on every call).

    A prebuilt schedule must fit the call: num_parts and block_kv as the tuning runs (and chunk_steps, where the
    kernel cuts pieces by its own chunk_steps, and fixed_overhead, where the kernel's schedule has its own; None: not
    compared), one split_offsets entry per request plus one,
    and token_slots (where it has them) one row per token of the call (num_tokens). ValueError naming the values
    otherwise. Where the lengths and the schedule are concrete (an eager call), it must also be the one `build()`
    gives for this batch's lengths: a schedule of other lengths walks their steps (wrong out and lse), so a
    ValueError says to build it again. Under jit the values are traced and not compared."""
    schedule = metadata.scheduler_metadata
    if not isinstance(schedule, Schedule):
        return build()
    wanted = {"num_parts": num_parts, "block_kv": block_kv, "chunk_steps": chunk_steps,
              "fixed_overhead": fixed_overhead}
    fields = [name for name, value in wanted.items() if value is not None]
    if any(getattr(schedule, name) != wanted[name] for name in fields):
        have = ", ".join(f"{name}={getattr(schedule, name)}" for name in fields)
        want = ", ".join(f"{name}={wanted[name]}" for name in fields)
        raise ValueError(f"metadata.scheduler_metadata holds a work schedule of {have}; the tuning runs {want}: "
                         "build it with with_schedule(metadata, config, tuning=...)")
    if schedule.num_reqs != metadata.num_reqs:
        raise ValueError(f"metadata.scheduler_metadata holds a work schedule of {schedule.num_reqs} requests, the "
                         f"batch has num_reqs={metadata.num_reqs}: build it with with_schedule(metadata, config, "
                         "tuning=...)")
    slots = schedule.token_slots
    if slots is not None and num_tokens is not None and tuple(slots.shape) != (num_tokens, 3):
        raise ValueError(f"metadata.scheduler_metadata holds token_slots of shape {tuple(slots.shape)}; the call has "
                         f"num_tokens={num_tokens} (shape ({num_tokens}, 3)): build it with with_schedule(metadata, "
                         "config, num_tokens=...)")
    pieces = schedule.pieces
    if pieces is not None and tuple(pieces.shape) != (schedule.num_slots, 3):
        raise ValueError(f"metadata.scheduler_metadata holds pieces of shape {tuple(pieces.shape)}, its slots need "
                         f"({schedule.num_slots}, 3): build it with with_schedule(metadata, config)")
    extras = [x for x in (slots, pieces, *jax.tree.leaves(schedule.kernel_rows)) if x is not None]
    arrays = (metadata.seq_lens, metadata.query_start_loc, schedule.table, schedule.split_offsets, *extras)
    if not any(isinstance(x, jax.core.Tracer) for x in arrays):
        fresh = build()

        def same(name):  # (an optional field is compared where both have it)
            got, want = getattr(schedule, name), getattr(fresh, name)
            pairs = list(zip(jax.tree.leaves(want), jax.tree.leaves(got)))
            if got is None or want is None or any(np.shape(w) != np.shape(g) for w, g in pairs):
                return True  # (kernel_rows of another geometry: the kernel builds its own in the call)
            return all(np.array_equal(np.asarray(w), np.asarray(g)) for w, g in pairs)

        if not all(same(name) for name in ("table", "split_offsets", "token_slots", "pieces", "kernel_rows")):
            raise ValueError("metadata.scheduler_metadata holds a work schedule built for other lengths than the "
                             "batch's seq_lens and query_start_loc: build it again with with_schedule(metadata, "
                             "config, tuning=...) whenever they change")
    return schedule


def reference_schedule(seq_lens, query_lens, *, num_parts: int, block_kv: int = DEFAULT_BLOCK_KV,
                       fixed_overhead: int = DEFAULT_FIXED_OVERHEAD, chunk_steps: int | None = None,
                       max_steps: int | None = None) -> Schedule:
    """The same schedule by plain loops in NumPy (the tests' oracle): every step (or chunk) is placed on the cost
    line one at a time and given to the part whose interval holds its point (chunk: its start)."""
    check_static_args(num_parts, block_kv, fixed_overhead, chunk_steps, max_steps)
    seq, qlen = np.asarray(seq_lens, np.int64), np.asarray(query_lens, np.int64)
    n = [(-(-int(s) // block_kv) if s > 0 and q > 0 else 0) for s, q in zip(seq, qlen)]
    num_pieces = sum((-(-x // chunk_steps) if chunk_steps else 1) for x in n if x)
    total = sum(n) + fixed_overhead * num_pieces
    if chunk_steps is not None and max(n, default=0) > max_steps:
        raise ValueError(f"max_steps must bound every request's steps, got max_steps={max_steps} < {max(n)} steps")
    cut = [p * total // num_parts for p in range(num_parts + 1)]
    if chunk_steps is None and fixed_overhead == 0:  # (_snapped_cuts: off the requests that fit one piece)
        cut = [_snap_reference(x, n, -(-total // num_parts)) for x in cut]
    part_of = lambda point: max(p for p in range(num_parts) if cut[p] <= point)  # noqa: E731
    units = []  # (part, request, first step, steps): steps, or whole chunks, in linear order
    point = 0
    for r, steps in enumerate(n):
        if not steps:
            continue
        if chunk_steps is None:
            point += fixed_overhead
            for s in range(steps):
                units.append((part_of(point), r, s, 1))
                point += 1
        else:
            for s in range(0, steps, chunk_steps):
                length = min(chunk_steps, steps - s)
                units.append((part_of(point), r, s, length))
                point += length + fixed_overhead
    return _reference_tables(units, n, num_parts, block_kv, fixed_overhead, chunk_steps, max_steps)


def _snap_reference(x, n, longest):
    """_snapped_cuts for one cut x, by a loop over the requests' steps n."""
    start = 0
    for steps in n:
        if start < x < start + steps and steps <= longest:
            return start if x - start <= start + steps - x else start + steps
        start += steps
    return x


def _reference_tables(units, n, num_parts, block_kv, fixed_overhead, chunk_steps, max_steps) -> Schedule:
    """Table and split offsets from the units in linear order: a new piece starts wherever the part, the request
    or (batch-invariant) the chunk changes."""
    table = np.zeros((num_parts, TABLE_COLUMNS), np.int32)
    slots_of = [0] * len(n)
    slot, prev = 0, None
    for part, r, s, length in units:
        chunk = s // chunk_steps if chunk_steps else 0
        row = table[part]
        if row[NUM_STEPS] == 0:
            row[[BEGIN_REQ, BEGIN_STEP, FIRST_SLOT]] = r, s, slot
        if (part, r, chunk) != prev:
            row[NUM_PIECES] += 1
            slots_of[r] += 1
            slot += 1
            prev = (part, r, chunk)
        row[[END_REQ, END_STEP]] = r, s + length
        row[NUM_STEPS] += length
    first = 0
    for row in table:  # an empty part's first slot: the slots used before it
        if row[NUM_STEPS] == 0:
            row[FIRST_SLOT] = first
        first = row[FIRST_SLOT] + row[NUM_PIECES]
    table[:, COST] = table[:, NUM_STEPS] + fixed_overhead * table[:, NUM_PIECES]
    offsets = np.concatenate([[0], np.cumsum(slots_of)]).astype(np.int32)
    num_slots = num_slots_bound(len(n), num_parts, chunk_steps, max_steps or 0)
    return Schedule(table, offsets, max(num_slots, 1), block_kv, fixed_overhead, chunk_steps or 0)


def pieces(schedule: Schedule, seq_lens, query_lens) -> list[list[tuple[int, int, int, int]]]:
    """Each part's pieces as (request, step_begin, step_end, slot), walked from the table the way a CTA walks it:
    requests BEGIN_REQ..END_REQ, skipping padding, each cut at multiples of chunk_steps in batch-invariant mode,
    slots counted up from FIRST_SLOT."""
    table = np.asarray(schedule.table)
    n = np.asarray(request_steps(seq_lens, query_lens, schedule.block_kv))
    out = []
    for row in table:
        items, slot = [], int(row[FIRST_SLOT])
        if row[NUM_STEPS] > 0:
            for r in range(int(row[BEGIN_REQ]), int(row[END_REQ]) + 1):
                lo = int(row[BEGIN_STEP]) if r == row[BEGIN_REQ] else 0
                hi = int(row[END_STEP]) if r == row[END_REQ] else int(n[r])
                while lo < hi:
                    c = schedule.chunk_steps
                    stop = min(hi, (lo // c + 1) * c) if c else hi
                    items.append((r, lo, stop, slot))
                    slot, lo = slot + 1, stop
        out.append(items)
    return out


@jax.jit(static_argnames=("num_tokens", "dtype"))
def combine_slots(o_part, lse_part, split_offsets, query_start_loc, num_tokens: int, dtype):
    """The ragged combine: token t of request r (its i-th) merges o_part[s, i] and lse_part[s, i] over r's slots
    s in [split_offsets[r], split_offsets[r + 1]) by LSE. o_part [S, Q, H, L], lse_part [S, Q, H] float32 (Q: the
    bucket's max q_len); slots outside the range are never read (they may hold NaN). Returns out [T, H, L] in dtype,
    lse [T, H]; a request with no slots gives out 0, lse -inf."""
    from mla_jax.combine import combine_slots_ref

    return combine_slots_ref(o_part, lse_part, split_offsets, query_start_loc, dtype, num_tokens=num_tokens)


def _piece_partial(q_nope, q_pe, rows, piece, scale):
    """One piece's partial. q_nope, q_pe [Q, H, *] float32: the request's tokens (rows past q_len unused); rows
    [K, L + R]: the request's cache rows, zero past seq_len; piece: int32 (request, first token, q_len, seq_len,
    first position, end position, slot). Returns out [Q, H, L] normalized over the piece's positions and lse
    [Q, H] (-inf, out 0 for a token that sees none of them: bottom-right causal, token i sees p <= S - Q + i)."""
    q_len, seq_len, lo, hi = piece[2], piece[3], piece[4], piece[5]
    num_q, lora = q_nope.shape[0], q_nope.shape[-1]
    pos = jnp.arange(rows.shape[0])
    inside = (pos >= lo) & (pos < hi)
    q_pos = seq_len - q_len + jnp.arange(num_q)
    visible = inside[None, :] & (pos[None, :] <= q_pos[:, None])  # [Q, K]
    rows = jnp.where(inside[:, None], rows, 0.0)
    s = jnp.einsum("qhl,kl->qhk", q_nope, rows[:, :lora], precision="highest")
    s += jnp.einsum("qhr,kr->qhk", q_pe, rows[:, lora:], precision="highest")
    s = jnp.where(visible[:, None, :], s * scale, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("qhk,kl->qhl", p / jnp.where(denom > 0, denom, 1.0), rows[:, :lora], precision="highest")
    return out, (m + jnp.log(denom))[..., 0]


def _all_rows(kv_cache, block_table, seq_lens, k_scale, page_size: int, fp8: bool):
    """Every request's cache rows [R, max_blocks * page_size, L + R] float32 (fp8: times k_scale), zero past its
    seq_len (the NaN there stays out of every product)."""
    pos = jnp.arange(block_table.shape[1] * page_size)
    rows = kv_cache[block_table[:, pos // page_size], pos % page_size].astype(jnp.float32)
    rows = rows * k_scale if fp8 else rows
    return jnp.where((pos[None, :] < seq_lens[:, None])[..., None], rows, 0.0)


@jax.jit(static_argnames=("num_slots", "num_q", "page_size", "fp8"))
def _partials(q_nope, q_pe, kv_cache, block_table, seq_lens, piece_rows, num_pieces, scale, k_scale, *,
              num_slots: int, num_q: int, page_size: int, fp8: bool):
    """Every piece's partial written to its slot: (o_part [num_slots, num_q, H, L], lse_part [num_slots, num_q,
    H]), NaN wherever no piece writes (unused slots, token rows past a request's q_len). q_nope, q_pe [T + num_q,
    H, *] float32, padded by num_q rows; piece_rows [num_slots, 7] int32 (see _piece_partial), the first
    num_pieces used."""
    rows = _all_rows(kv_cache, block_table, seq_lens, k_scale, page_size, fp8)
    shape = (num_slots, num_q, q_nope.shape[1])
    parts = (jnp.full(shape + (q_nope.shape[2],), jnp.nan, jnp.float32), jnp.full(shape, jnp.nan, jnp.float32))

    def one_piece(k, parts):
        o_part, lse_part = parts
        piece = piece_rows[k]
        qn = jax.lax.dynamic_slice_in_dim(q_nope, piece[1], num_q)
        qp = jax.lax.dynamic_slice_in_dim(q_pe, piece[1], num_q)
        out, lse = _piece_partial(qn, qp, rows[piece[0]], piece, scale)
        mine = jnp.arange(num_q) < piece[2]
        slot = piece[6]
        o_part = o_part.at[slot].set(jnp.where(mine[:, None, None], out, o_part[slot]))
        return o_part, lse_part.at[slot].set(jnp.where(mine[:, None], lse, lse_part[slot]))

    return jax.lax.fori_loop(0, num_pieces, one_piece, parts)


def decode_by_schedule(q, kv_cache, metadata, config, schedule: Schedule, k_scale=1.0):
    """Split-KV decode that follows `schedule` (concrete, as are the metadata arrays): each piece of `pieces`
    computes its partial over its steps with bottom-right causal masking (token i of a request with q_len Q, seq_len
    S sees positions <= S - Q + i), writes it to its slot of a NaN-filled buffer [num_slots, max_query_len, H, L],
    then `combine_slots` merges each request's slots. Returns out [T, H, L] in q's dtype, lse [T, H] float32.
    The jnp reference beside the kernels that walk the schedule: one piece at a time (a loop in XLA), slow."""
    from mla_jax.api import split_q

    q_nope, q_pe = split_q(q, config)
    dtype, num_q = q_nope.dtype, metadata.max_query_len
    pad = lambda x: jnp.pad(jnp.asarray(x, jnp.float32), ((0, num_q), (0, 0), (0, 0)))  # noqa: E731
    qsl, seq, bt = (np.asarray(x) for x in (metadata.query_start_loc, metadata.seq_lens, metadata.block_table))
    block = schedule.block_kv
    items = [(r, qsl[r], qsl[r + 1] - qsl[r], seq[r], lo * block, hi * block, slot)
             for part in pieces(schedule, seq, qsl[1:] - qsl[:-1]) for r, lo, hi, slot in part]
    piece_rows = np.zeros((schedule.num_slots, 7), np.int32)
    piece_rows[: len(items)] = np.asarray(items, np.int32).reshape(-1, 7)
    o_part, lse_part = _partials(pad(q_nope), pad(q_pe), jnp.asarray(kv_cache), jnp.asarray(bt), jnp.asarray(seq),
                                 piece_rows, len(items), jnp.float32(config.softmax_scale), jnp.float32(k_scale),
                                 num_slots=schedule.num_slots, num_q=num_q, page_size=config.page_size,
                                 fp8=config.is_fp8_kv_cache)
    return combine_slots(o_part, lse_part, schedule.split_offsets, qsl, num_tokens=int(qsl[-1]), dtype=dtype)

mla_schedule_jit = jax.jit(
    mla_schedule, static_argnames=("num_parts", "block_kv", "fixed_overhead", "chunk_steps", "max_steps"))
"""mla_schedule compiled once per (R, static arguments): new lengths reuse it."""
