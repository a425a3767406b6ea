"""The cache write, `write_kv` of both stacks (vLLM's `concat_and_cache_mla`): row t goes to slot
`slot_mapping[t]` = block * page_size + offset, -1 skips it, every other slot keeps its bits.

Both stacks write bitwise the same cache as a NumPy model of the contract (bf16 and fp8, packed and split rows) over
a cache of random bits and NaN; the fp8 quantization rule is one (`mla_spec.fp8`), bitwise the same in NumPy, torch
and JAX; a decode after the writes matches the float64 reference; the JAX write aliases the donated cache and the
torch write stays in the same storage; bad input raises ValueError naming the value. The `gpu` tests capture the
torch write in a CUDA graph and compare both stacks on the GPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from jax import lax

import mla_jax
import mla_torch
from mla_spec import MLAConfig, fp8_k_scale, quantize_fp8, reference
from parity.compare import TOLERANCES, compare
from parity.scenarios import SCENARIOS, make_batch

STACKS = ("torch", "jax")
NUM_BLOCKS, PAGE = 6, 16
NUM_SLOTS = NUM_BLOCKS * PAGE
L, R = 512, 64
D = L + R
CONFIGS = {
    "bfloat16": MLAConfig(num_heads=16, page_size=PAGE),
    "fp8": MLAConfig(num_heads=16, page_size=PAGE, kv_cache_dtype="fp8_e4m3"),
}
K_SCALE = 0.0123  # a scale whose divisions round: x / k_scale is not x * (1 / k_scale)
BITS = {"bfloat16": np.uint16, "fp8": np.uint8}
NP_CACHE = {"bfloat16": ml_dtypes.bfloat16, "fp8": ml_dtypes.float8_e4m3fn}
TORCH_BITS = {np.uint16: torch.int16, np.uint8: torch.uint8}
TORCH_CACHE = {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
JAX_CACHE = {"bfloat16": jnp.bfloat16, "fp8": jnp.float8_e4m3fn}


def random_cache_bits(kind: str, seed: int = 0) -> np.ndarray:
    """A cache of random bit patterns (NaN payloads and -0.0 among them), one block all NaN."""
    rng = np.random.default_rng(seed)
    bits = BITS[kind]
    cache = rng.integers(0, np.iinfo(bits).max + 1, size=(NUM_BLOCKS, PAGE, D), dtype=np.uint64).astype(bits)
    cache[2] = 0x7FC1 if kind == "bfloat16" else 0x7F  # NaN (a bf16 one with a payload)
    return cache


def random_rows(t: int, seed: int = 1) -> np.ndarray:
    """bf16 rows [t, 576] (as float32): normal values at several scales, and a few to saturate an fp8 cache."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((t, D)).astype(np.float32) * rng.choice([1e-3, 0.1, 1.0, 4.0], size=(t, 1))
    rows[0, :4] = [1e4, -1e4, np.inf, -np.inf]
    return rows.astype(ml_dtypes.bfloat16).astype(np.float32)


def slot_mapping(t: int, seed: int = 2, skip=(0, 3, 7)) -> np.ndarray:
    """t distinct slots in random order, -1 at the rows `skip` (the first one included)."""
    rng = np.random.default_rng(seed)
    slots = rng.permutation(NUM_SLOTS)[:t].astype(np.int64)
    slots[[i for i in skip if i < t]] = -1
    return slots


def row_bits(kind: str, rows: np.ndarray, k_scale: float) -> np.ndarray:
    """The bits the contract stores for `rows`: bf16 as they are, fp8 by mla_spec.fp8's rule."""
    if kind == "fp8":
        return quantize_fp8(rows, k_scale).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return rows.astype(ml_dtypes.bfloat16).view(np.uint16)


def expected_cache(kind: str, cache_bits: np.ndarray, rows: np.ndarray, slots: np.ndarray, k_scale: float):
    """The NumPy model: every row with a slot >= 0 overwrites that slot; nothing else changes."""
    out = cache_bits.copy().reshape(NUM_SLOTS, D)
    keep = slots >= 0
    out[slots[keep]] = row_bits(kind, rows, k_scale)[keep]
    return out.reshape(cache_bits.shape)


def run_write(stack: str, kind: str, cache_bits, rows, slots, *, packed=False, k_scale=1.0, slot_dtype=np.int64,
              check_values=None):
    """write_kv of `stack` on the cache of those bits; returns the written cache's bits (NumPy)."""
    config = CONFIGS[kind]
    kv = rows.astype(ml_dtypes.bfloat16)
    kv_c, k_pe = (kv, None) if packed else (kv[:, :L], kv[:, L:])
    slots = slots.astype(slot_dtype)
    if stack == "torch":
        cache = torch.from_numpy(cache_bits.copy()).view(TORCH_BITS[cache_bits.dtype.type]).view(TORCH_CACHE[kind])

        def conv(x):
            return None if x is None else torch.from_numpy(np.ascontiguousarray(x.view(np.uint16))).view(torch.bfloat16)

        out = mla_torch.write_kv(cache, conv(kv_c), conv(k_pe), torch.from_numpy(slots), config, k_scale=k_scale,
                                 check_values=check_values)
        assert out is cache
        return out.view(TORCH_BITS[cache_bits.dtype.type]).numpy().view(cache_bits.dtype)
    cache = jnp.asarray(cache_bits.view(NP_CACHE[kind]))
    out = mla_jax.write_kv(cache, kv_c, k_pe, jnp.asarray(slots), config, k_scale=k_scale, check_values=check_values)
    assert cache.is_deleted()  # donated: consumed by the write
    return np.asarray(out).view(cache_bits.dtype)


def assert_bits_equal(actual, expected, what: str):
    diff = np.argwhere(actual != expected)
    assert diff.size == 0, f"{what}: {len(diff)} elements differ, first at {tuple(diff[0])}: " \
                           f"{actual[tuple(diff[0])]:#x} != {expected[tuple(diff[0])]:#x}"


# ----------------------------------------------------------------------------- the fp8 rule, one on three stacks


def test_quantize_fp8_is_one_rule_on_numpy_torch_and_jax():
    """mla_spec.quantize_fp8 (the definition), mla_torch.quantize_fp8 and mla_jax.quantize_fp8 agree bitwise on every
    bf16 value, random float32 values and the specials, at scales whose divisions round; and the definition is
    ml_dtypes' round-to-nearest-even cast after the saturating clip."""
    rng = np.random.default_rng(0)
    every_bf16 = (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32)
    random_f32 = rng.integers(0, 2**32, size=2**15, dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = (rng.standard_normal(2**15) * rng.choice([1e-4, 1e-2, 1.0, 300.0], size=2**15)).astype(np.float32)
    x = np.concatenate([every_bf16, random_f32, normal])
    for k_scale in (1.0, 0.003, K_SCALE, 0.37, 7.1):
        ref = quantize_fp8(x, k_scale)
        with np.errstate(over="ignore", invalid="ignore"):
            direct = np.clip(x / np.float32(k_scale), -448, 448).astype(ml_dtypes.float8_e4m3fn)
        ref_bits = ref.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        torch_bits = mla_torch.quantize_fp8(torch.from_numpy(x), k_scale).view(torch.uint8).numpy()
        jax_bits = np.asarray(lax.bitcast_convert_type(mla_jax.quantize_fp8(jnp.asarray(x), k_scale), jnp.uint8))
        nan = np.isnan(ref)
        for name, bits in (("ml_dtypes", direct.view(np.uint8)), ("torch", torch_bits), ("jax", jax_bits)):
            got_nan = (bits & 0x7F) == 0x7F
            assert np.array_equal(got_nan, nan), f"{name}, k_scale={k_scale}: NaN positions differ"
            bad = np.flatnonzero((bits != ref_bits) & ~nan)
            assert bad.size == 0, (f"{name}, k_scale={k_scale}: {bad.size} values differ, first x={x[bad[0]]!r}: "
                                   f"{bits[bad[0]]:#x} != {ref_bits[bad[0]]:#x}")
        assert np.abs(ref[~nan]).max() == 448.0  # saturated, never inf


def test_fp8_k_scale():
    assert fp8_k_scale(448.0) == 1.0
    assert fp8_k_scale(1.0) == float(np.float32(1 / 448))
    assert fp8_k_scale(0.0) == 1.0  # a cache of zeros


# ----------------------------------------------------------------------------- the write, bitwise


@pytest.mark.parametrize("kind", ["bfloat16", "fp8"])
def test_both_stacks_write_the_contract_bitwise(kind):
    """Random-bit cache (NaN payloads included), 40 rows with -1 among them (the first row too): both stacks, packed
    and split rows, int32 and int64 slot mappings, equal the NumPy model bit for bit; every slot not written keeps
    its bits."""
    cache_bits = random_cache_bits(kind)
    rows, slots = random_rows(40), slot_mapping(40)
    k_scale = K_SCALE if kind == "fp8" else 1.0
    expected = expected_cache(kind, cache_bits, rows, slots, k_scale)
    untouched = np.ones(NUM_SLOTS, bool)
    untouched[slots[slots >= 0]] = False
    assert untouched.sum() == NUM_SLOTS - 37
    for stack in STACKS:
        for packed in (False, True):
            for slot_dtype in (np.int64, np.int32):
                got = run_write(stack, kind, cache_bits, rows, slots, packed=packed, k_scale=k_scale,
                                slot_dtype=slot_dtype)
                what = f"{stack}, {'packed' if packed else 'split'}, {np.dtype(slot_dtype).name}"
                assert_bits_equal(got, expected, what)
                assert_bits_equal(got.reshape(NUM_SLOTS, D)[untouched],
                                  cache_bits.reshape(NUM_SLOTS, D)[untouched], f"{what}: untouched slots")


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("kind", ["bfloat16", "fp8"])
def test_skipped_rows_write_nothing(stack, kind):
    """All rows -1 (the torch write then carries slot 0's own bits back to it), and no rows at all: the cache keeps
    every bit; -1 rows only, around one real row, write that row alone."""
    cache_bits = random_cache_bits(kind, seed=3)
    cache_bits[0, 0, :8] = 0x7FC3 if kind == "bfloat16" else 0xFF  # slot 0: NaN with a payload / a negative NaN
    k_scale = K_SCALE if kind == "fp8" else 1.0
    rows = random_rows(5)
    none = np.full(5, -1)
    assert_bits_equal(run_write(stack, kind, cache_bits, rows, none, k_scale=k_scale), cache_bits, "all rows -1")
    assert_bits_equal(run_write(stack, kind, cache_bits, rows[:0], none[:0], k_scale=k_scale), cache_bits, "T = 0")
    one = np.array([-1, -1, 17, -1, -1])
    assert_bits_equal(run_write(stack, kind, cache_bits, rows, one, k_scale=k_scale),
                      expected_cache(kind, cache_bits, rows, one, k_scale), "one row among -1 rows")


@pytest.mark.parametrize("stack", STACKS)
def test_unchecked_slot_mapping(stack):
    """check_values=False (the path of a GPU slot mapping or a traced one) writes the same cache."""
    cache_bits = random_cache_bits("bfloat16", seed=4)
    rows, slots = random_rows(12), slot_mapping(12, seed=5)
    assert_bits_equal(run_write(stack, "bfloat16", cache_bits, rows, slots, check_values=False),
                      expected_cache("bfloat16", cache_bits, rows, slots, 1.0), "check_values=False")


# ----------------------------------------------------------------------------- write, then decode


def _token_slots(batch):
    """(slots [S_total], rows [S_total, 576], is_new [S_total]) for every KV position of every request."""
    P = batch.config.page_size
    bt = np.asarray(batch.metadata.block_table)
    slots, rows, new = [], [], []
    for r, (seq_len, q_len) in enumerate(zip(batch.scenario.seq_lens, batch.scenario.query_lens)):
        pos = np.arange(seq_len)
        slots.append(bt[r, pos // P] * P + pos % P)
        rows.append(batch.kv_cache[bt[r, pos // P], pos % P])
        new.append(pos >= seq_len - q_len)
    return np.concatenate(slots), np.concatenate(rows), np.concatenate(new)


@pytest.mark.parametrize("kind", ["bfloat16", "fp8"])
def test_decode_after_write_kv_matches_the_reference(kind):
    """A NaN cache filled by two writes per stack (the context, then the step's new tokens among -1 padding rows),
    then decoded (torch reference, JAX xla): the written cache is the batch's cache (fp8: quantized by the rule) bit
    for bit in every readable slot, NaN elsewhere, and the decode matches the float64 reference on it."""
    fp8 = kind == "fp8"
    extra = dict(kv_cache_dtype="fp8_e4m3") if fp8 else {}
    batch = make_batch(SCENARIOS["spec_decode_page_16"], "bfloat16", **extra)  # seq (8, 64, 200), q (8, 5, 2), P=16
    config, md = batch.config, batch.metadata
    slots, rows, new = _token_slots(batch)
    k_scale = fp8_k_scale(np.abs(rows).max()) if fp8 else 1.0
    num_blocks = batch.kv_cache.shape[0]
    nan_bits = np.full(batch.kv_cache.shape, 0x7F if fp8 else 0x7FC0, BITS[kind])
    # the reference's cache: the batch's values (quantized by the rule for fp8), NaN in every slot not written
    ref_cache = quantize_fp8(batch.kv_cache, k_scale) if fp8 else batch.kv_cache
    ref_out, ref_lse = reference.mla_decode(batch.q, ref_cache, md, config, k_scale=k_scale)
    padded_new = np.full(new.sum() + 3, -1)
    padded_new[1:-2] = slots[new]  # the step's tokens among padding rows
    padded_rows = np.zeros((padded_new.size, D), np.float32)
    padded_rows[1:-2] = rows[new]
    tol = TOLERANCES["bfloat16"]
    scale = 2 if fp8 else 1
    for stack in STACKS:
        bf16 = lambda x: x.astype(ml_dtypes.bfloat16)  # noqa: E731
        if stack == "torch":
            def conv(x):
                return torch.from_numpy(np.ascontiguousarray(bf16(x).view(np.uint16))).view(torch.bfloat16)
            bits = TORCH_BITS[BITS[kind]]
            cache = torch.from_numpy(nan_bits.copy()).view(bits).view(TORCH_CACHE[kind])
            for s, x in ((slots[~new], rows[~new]), (padded_new, padded_rows)):
                mla_torch.write_kv(cache, conv(x[:, :L]), conv(x[:, L:]), torch.from_numpy(s), config, k_scale=k_scale)
            got_bits = cache.view(bits).numpy().view(BITS[kind])
            out, lse = mla_torch.mla_decode(conv(batch.q), cache, md, config, impl="reference", k_scale=k_scale)
            out = out.float().numpy()
            lse = lse.numpy()
        else:
            cache = jnp.asarray(nan_bits.view(NP_CACHE[kind]))
            for s, x in ((slots[~new], rows[~new]), (padded_new, padded_rows)):
                cache = mla_jax.write_kv(cache, bf16(x[:, :L]), bf16(x[:, L:]), jnp.asarray(s, jnp.int32), config,
                                         k_scale=k_scale)
            got_bits = np.asarray(cache).view(BITS[kind])
            out, lse = mla_jax.mla_decode(jnp.asarray(bf16(batch.q)), cache, md, config, impl="xla", k_scale=k_scale)
            out = np.asarray(out.astype(jnp.float32))
            lse = np.asarray(lse)
        want = nan_bits.copy().reshape(-1, D)
        want[slots] = row_bits(kind, rows, k_scale)
        assert_bits_equal(got_bits, want.reshape(num_blocks, PAGE, D), f"{stack}: written cache")
        c_out = compare(out, ref_out, name="out", rel_tol=scale * tol["out_rel"], cos_tol=1 - scale * (1 - tol["out_cos"]))
        c_lse = compare(lse, ref_lse, name="lse", abs_tol=scale * tol["lse_abs"])
        assert c_out.ok, f"{stack}: {c_out.message}"
        assert c_lse.ok, f"{stack}: {c_lse.message}"


# ----------------------------------------------------------------------------- in place


@pytest.mark.parametrize("kind", ["bfloat16", "fp8"])
def test_jax_write_kv_under_jit_aliases_the_donated_cache(kind):
    """jax.jit(write_kv, donate_argnums=0): the compiled executable aliases the cache's input and output buffers
    (input_output_alias, alias bytes = the cache's bytes), the donated array is deleted after the call, and the
    result is the eager write's, bit for bit. The slot mapping is traced: its values are not checked there."""
    config = CONFIGS[kind]
    k_scale = K_SCALE if kind == "fp8" else 1.0
    cache_bits = random_cache_bits(kind, seed=6)
    rows, slots = random_rows(9), slot_mapping(9, seed=7)
    kv = rows.astype(ml_dtypes.bfloat16)
    step = jax.jit(mla_jax.write_kv, static_argnames=("config",), donate_argnums=(0,))
    cache = jnp.asarray(cache_bits.view(NP_CACHE[kind]))
    args = (cache, kv[:, :L], kv[:, L:], jnp.asarray(slots, jnp.int32), config)
    scale = dict(k_scale=jnp.float32(k_scale)) if kind == "fp8" else {}  # (traced: a bf16 cache takes only 1.0)
    compiled = step.lower(*args, **scale).compile()
    assert "input_output_alias={ {}: (0, {}, may-alias) }" in compiled.as_text()
    assert compiled.memory_analysis().alias_size_in_bytes == cache.nbytes
    out = step(*args, **scale)
    assert cache.is_deleted()
    assert_bits_equal(np.asarray(out).view(cache_bits.dtype), expected_cache(kind, cache_bits, rows, slots, k_scale),
                      "jitted write")


def _assert_scatter_in_place(kind: str):
    """The write compiles to one scatter into the aliased cache buffer: XLA's temporaries are far smaller than the
    cache (no copy of it)."""
    config = CONFIGS[kind]
    cache = jnp.zeros((64, PAGE, D), JAX_CACHE[kind])
    kv = jnp.ones((8, D), jnp.bfloat16)
    step = jax.jit(mla_jax.write_kv, static_argnames=("config",), donate_argnums=(0,))
    scale = dict(k_scale=jnp.float32(K_SCALE)) if kind == "fp8" else {}
    compiled = step.lower(cache, kv, None, jnp.arange(8, dtype=jnp.int32), config, **scale).compile()
    stats = compiled.memory_analysis()
    assert stats.alias_size_in_bytes == cache.nbytes
    assert stats.temp_size_in_bytes < cache.nbytes // 16, stats


def test_jax_write_kv_in_place_without_a_copy():
    """A bf16 cache, on any backend. (XLA:CPU has no fp8 scatter: it converts an fp8 cache through f16 and back,
    two copies; XLA:GPU scatters fp8 in place, `test_jax_fp8_write_kv_in_place_on_the_gpu`.)"""
    _assert_scatter_in_place("bfloat16")


@pytest.mark.gpu
def test_jax_fp8_write_kv_in_place_on_the_gpu():
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU here")
    _assert_scatter_in_place("fp8")


def test_jax_traced_out_of_range_slots_are_dropped():
    """Under jit (values unchecked) a slot outside [0, num_slots), -1 or not, writes nothing: it never wraps."""
    cache_bits = random_cache_bits("bfloat16", seed=8)
    rows = random_rows(4)
    slots = np.array([-2, NUM_SLOTS, NUM_SLOTS + 5, -NUM_SLOTS])
    step = jax.jit(mla_jax.write_kv, static_argnames=("config",), donate_argnums=(0,))
    kv = rows.astype(ml_dtypes.bfloat16)
    out = step(jnp.asarray(cache_bits.view(ml_dtypes.bfloat16)), kv, None, jnp.asarray(slots, jnp.int32),
               CONFIGS["bfloat16"])
    assert_bits_equal(np.asarray(out).view(np.uint16), cache_bits, "out-of-range slots")


def test_torch_write_kv_in_place():
    """The torch write returns the cache tensor itself, in the same storage, and leaves views of it consistent."""
    config = CONFIGS["bfloat16"]
    cache = torch.zeros((NUM_BLOCKS, PAGE, D), dtype=torch.bfloat16)
    view = cache[1]
    ptr = cache.data_ptr()
    kv = torch.arange(2 * D, dtype=torch.float32).reshape(2, D).bfloat16()
    out = mla_torch.write_kv(cache, kv, None, torch.tensor([PAGE + 3, -1]), config)
    assert out is cache and cache.data_ptr() == ptr
    assert torch.equal(view[3], kv[0]) and int((cache != 0).sum()) == int((kv[0] != 0).sum())


# ----------------------------------------------------------------------------- bad input


def _valid(stack: str, kind: str = "bfloat16", t: int = 4):
    rows = random_rows(t).astype(ml_dtypes.bfloat16)
    slots = np.arange(t, dtype=np.int64)
    cache = np.zeros((NUM_BLOCKS, PAGE, D), NP_CACHE[kind])
    return dict(kv_cache=cache, kv_c=rows[:, :L], k_pe=rows[:, L:], slot_mapping=slots, config=CONFIGS[kind],
                k_scale=K_SCALE if kind == "fp8" else 1.0)


def _to_stack(stack: str, x):
    if not isinstance(x, np.ndarray):
        return x
    if stack == "jax":
        return jnp.asarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(x).view(np.uint16)).view(torch.bfloat16)
    if x.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(x))


def _call(stack: str, kw: dict):
    kw = {k: _to_stack(stack, v) for k, v in kw.items()}
    write = mla_torch.write_kv if stack == "torch" else mla_jax.write_kv
    return write(kw.pop("kv_cache"), kw.pop("kv_c"), kw.pop("k_pe"), kw.pop("slot_mapping"), kw.pop("config"), **kw)


def _rows(t, width, dtype=ml_dtypes.bfloat16):
    return np.zeros((t, width), dtype)


BAD = {
    # name: (kind, changes, message regex)
    "kv_c width": ("bfloat16", dict(kv_c=_rows(4, 500)), r"kv_c must be \[T, 512\], got kv_c.shape=\(4, 500\)"),
    "k_pe width": ("bfloat16", dict(k_pe=_rows(4, 32)), r"k_pe must be \[T, 64\], got k_pe.shape=\(4, 32\)"),
    "kv_c 3-D": ("bfloat16", dict(kv_c=np.zeros((4, 1, 512), ml_dtypes.bfloat16)), r"kv_c.shape=\(4, 1, 512\)"),
    "packed width": ("bfloat16", dict(k_pe=None), r"packed kv_c \(k_pe=None\) must be \[T, .* 576\], got kv_c.shape=\(4, 512\)"),
    "token counts": ("bfloat16", dict(k_pe=_rows(3, 64)), r"same token count, got kv_c.shape=\(4, 512\), k_pe.shape=\(3, 64\)"),
    "kv_c dtype": ("bfloat16", dict(kv_c=_rows(4, 512, np.float32)), r"kv_c dtype must be config.dtype='bfloat16', got kv_c.dtype=float32"),
    "k_pe dtype": ("bfloat16", dict(k_pe=_rows(4, 64, np.float16)), r"k_pe dtype must be .*got k_pe.dtype=float16"),
    "cache page": ("bfloat16", dict(kv_cache=np.zeros((NUM_BLOCKS, 8, D), ml_dtypes.bfloat16)),
                   r"kv_cache must be \[num_blocks, page_size=16, 576\], got kv_cache.shape=\(6, 8, 576\)"),
    "cache bf16 for fp8": ("fp8", dict(kv_cache=np.zeros((NUM_BLOCKS, PAGE, D), ml_dtypes.bfloat16)),
                           r"kv_cache dtype must be float8_e4m3fn with kv_cache_dtype='fp8_e4m3', got kv_cache.dtype=bfloat16"),
    "cache fp8 for auto": ("bfloat16", dict(kv_cache=np.zeros((NUM_BLOCKS, PAGE, D), ml_dtypes.float8_e4m3fn)),
                           r"got kv_cache.dtype=float8_e4m3fn \(an fp8 cache needs kv_cache_dtype='fp8_e4m3'\)"),
    "slots 2-D": ("bfloat16", dict(slot_mapping=np.zeros((4, 1), np.int64)), r"slot_mapping must be \[T\] with T = kv_c.shape\[0\] = 4, got slot_mapping.shape=\(4, 1\)"),
    "slots length": ("bfloat16", dict(slot_mapping=np.arange(5)), r"got slot_mapping.shape=\(5,\)"),
    "slots float": ("bfloat16", dict(slot_mapping=np.arange(4, dtype=np.float32)), r"slot_mapping dtype must be one of \('int32', 'int64'\), got slot_mapping.dtype=float32"),
    "slot past the cache": ("bfloat16", dict(slot_mapping=np.array([0, 1, 2, NUM_SLOTS])),
                            r"-1 \(skip the row\) or a slot in \[0, num_blocks \* page_size = 96\), got slot_mapping\[3\]=96"),
    "slot below -1": ("bfloat16", dict(slot_mapping=np.array([-2, 1, 2, 3])), r"got slot_mapping\[0\]=-2"),
    "slot twice": ("bfloat16", dict(slot_mapping=np.array([5, -1, 9, 5])),
                   r"must not write a slot twice, got slot 5 at slot_mapping\[0\] and slot_mapping\[3\]"),
    "k_scale 0": ("fp8", dict(k_scale=0.0), r"k_scale must be finite, > 0 .*got k_scale=0.0"),
    "k_scale negative": ("fp8", dict(k_scale=-1.0), r"got k_scale=-1.0"),
    "k_scale inf": ("fp8", dict(k_scale=float("inf")), r"got k_scale=inf"),
    "k_scale nan": ("fp8", dict(k_scale=float("nan")), r"got k_scale=nan"),
    "k_scale past float32": ("fp8", dict(k_scale=1e39), r"got k_scale=1e\+39"),
    "k_scale 2-D": ("fp8", dict(k_scale=np.ones((1, 1), np.float32)), r"k_scale must be a scalar \(0-d\), got k_scale.shape=\(1, 1\)"),
    "k_scale on a bf16 cache": ("bfloat16", dict(k_scale=0.5), r"k_scale applies to an fp8 KV cache only; .*got k_scale=0.5"),
    "config": ("bfloat16", dict(config="bf16"), r"config must be an mla_spec.MLAConfig, got config=str"),
}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_a_value_error_naming_it(stack, case):
    kind, changes, message = BAD[case]
    kw = {**_valid(stack, kind), **changes}
    with pytest.raises(ValueError, match=message):
        _call(stack, kw)


@pytest.mark.parametrize("stack", STACKS)
def test_bad_input_not_an_array(stack):
    kw = {**_valid(stack), "kv_c": [[0.0] * L] * 4}
    with pytest.raises(ValueError, match=r"kv_c must be (a torch tensor|an array), got kv_c=list"):
        _call(stack, kw)


def test_torch_bad_input_cache_layout():
    kw = {k: _to_stack("torch", v) for k, v in _valid("torch").items()}
    cache = torch.zeros((PAGE, NUM_BLOCKS, D), dtype=torch.bfloat16).transpose(0, 1)
    with pytest.raises(ValueError, match=r"kv_cache must be contiguous \(it is written in place\), got kv_cache.stride\(\)=\(576, 3456, 1\)"):
        mla_torch.write_kv(cache, kw["kv_c"], kw["k_pe"], kw["slot_mapping"], kw["config"])
    with pytest.raises(ValueError, match=r"kv_c must be a torch tensor, got kv_c=ndarray"):
        mla_torch.write_kv(kw["kv_cache"], np.zeros((4, L)), kw["k_pe"], kw["slot_mapping"], kw["config"])


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bfloat16", "fp8"])
def test_torch_write_kv_cuda_graph(kind):
    """The torch write captured in a CUDA graph (k_scale a device tensor), replayed with new rows, slots (-1 among
    them) and scale in the captured tensors: each replay writes what an eager CPU write does, bit for bit; an
    eager GPU write does not synchronize with the host."""
    config = CONFIGS[kind]
    dev = torch.device("cuda")
    bits_np = BITS[kind]
    bits_t = TORCH_BITS[bits_np]
    cache_bits = random_cache_bits(kind, seed=9)
    cache = torch.from_numpy(cache_bits.copy()).view(bits_t).view(TORCH_CACHE[kind]).to(dev)
    T = 24
    kv_c = torch.zeros((T, L), dtype=torch.bfloat16, device=dev)
    k_pe = torch.zeros((T, R), dtype=torch.bfloat16, device=dev)
    slots = torch.full((T,), -1, dtype=torch.int64, device=dev)
    k_scale = torch.ones((), dtype=torch.float32, device=dev) if kind == "fp8" else 1.0

    def write():
        mla_torch.write_kv(cache, kv_c, k_pe, slots, config, k_scale=k_scale)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        write()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    cache.view(bits_t).copy_(torch.from_numpy(cache_bits).view(bits_t))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write()
    expected = cache_bits
    for step, skip in enumerate(((0, 3), (), tuple(range(T)))):
        rows, new_slots = random_rows(T, seed=10 + step), slot_mapping(T, seed=20 + step, skip=skip)
        scale = (0.01 + 0.005 * step) if kind == "fp8" else 1.0
        kv = torch.from_numpy(rows.astype(ml_dtypes.bfloat16).view(np.uint16)).view(torch.bfloat16)
        kv_c.copy_(kv[:, :L])
        k_pe.copy_(kv[:, L:])
        slots.copy_(torch.from_numpy(new_slots))
        if kind == "fp8":
            k_scale.fill_(scale)
        graph.replay()
        expected = expected_cache(kind, expected, rows, new_slots, scale)
        assert_bits_equal(cache.view(bits_t).cpu().numpy().view(bits_np), expected, f"replay {step}")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        write()  # raises on a synchronizing call
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bfloat16", "fp8"])
def test_both_stacks_write_bitwise_on_the_gpu(kind):
    """On the GPU too both stacks write the NumPy model's bits (the fp8 division is a true division on both)."""
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU here")
    cache_bits = random_cache_bits(kind, seed=11)
    rows, slots = random_rows(64, seed=12), slot_mapping(64, seed=13)
    k_scale = K_SCALE if kind == "fp8" else 1.0
    expected = expected_cache(kind, cache_bits, rows, slots, k_scale)
    config = CONFIGS[kind]
    kv = rows.astype(ml_dtypes.bfloat16)
    bits_t = TORCH_BITS[BITS[kind]]
    dev = torch.device("cuda")
    cache_t = torch.from_numpy(cache_bits.copy()).view(bits_t).view(TORCH_CACHE[kind]).to(dev)
    kv_t = torch.from_numpy(kv.view(np.uint16)).view(torch.bfloat16).to(dev)
    scale = torch.tensor(k_scale, dtype=torch.float32, device=dev) if kind == "fp8" else 1.0
    mla_torch.write_kv(cache_t, kv_t, None, torch.from_numpy(slots).to(dev), config, k_scale=scale)
    assert_bits_equal(cache_t.view(bits_t).cpu().numpy().view(BITS[kind]), expected, "torch on the GPU")
    out = mla_jax.write_kv(jnp.asarray(cache_bits.view(NP_CACHE[kind])), kv, None, jnp.asarray(slots, jnp.int32),
                           config, k_scale=k_scale)
    assert_bits_equal(np.asarray(out).view(BITS[kind]), expected, "jax on the GPU")
