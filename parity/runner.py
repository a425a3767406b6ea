"""The parity runner: every implementation that can run here, on each scenario,
against the torch reference; plus FA3 against each Pallas kernel where both run.

Inputs are made once per (scenario, dtype) as torch tensors on the device (CUDA
if present) and shared with JAX through DLPack (zero-copy on the GPU).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
from typing import Callable

import numpy as np
import torch

from mla_torch.flashmla import flashmla_interface  # (the package's one FlashMLA lookup; the sparse decode's too)
from parity.compare import Comparison, compare_out_lse
from parity.scenarios import SCENARIOS, Batch, Scenario, make_batch

BASELINE = "torch.reference"
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def torch_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def jax_on_gpu() -> bool:
    import jax

    return jax.default_backend() == "gpu"


@dataclasses.dataclass
class Inputs:
    """One batch as torch tensors on the device, and the same memory as JAX arrays."""

    batch: Batch
    q: torch.Tensor
    kv_cache: torch.Tensor
    _jax: tuple | None = None

    @classmethod
    def make(cls, batch: Batch, device=None) -> "Inputs":
        device = device or torch_device()
        dt = _TORCH_DTYPES[batch.config.dtype]
        q = torch.from_numpy(batch.q).to(device=device, dtype=dt)
        kv = torch.from_numpy(batch.kv_cache).to(device=device, dtype=dt)
        return cls(batch, q, kv)

    def jax_arrays(self):
        if self._jax is None:
            import jax
            import jax.numpy as jnp

            if self.q.is_cuda and jax_on_gpu():
                self._jax = (jax.dlpack.from_dlpack(self.q), jax.dlpack.from_dlpack(self.kv_cache))
            else:  # host: JAX's own CPU arrays (torch CPU bf16 has no NumPy view)
                jdt = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}[self.batch.config.dtype]
                self._jax = (jnp.asarray(self.batch.q, jdt), jnp.asarray(self.batch.kv_cache, jdt))
        return self._jax


def _to_np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, np.float32) if np.asarray(x).dtype != np.float64 else np.asarray(x)


@dataclasses.dataclass(frozen=True)
class Impl:
    name: str
    run: Callable[[Inputs], tuple]
    unsupported: Callable[[Batch], str | None]
    # "nan": fed the strict batch (NaN in every unreadable slot). "finite": the tails of
    # last pages hold large finite garbage instead (FA3 multiplies masked zeros by those
    # rows, so NaN there propagates).
    page_tail: str = "nan"


def _torch_impl(impl: str) -> Impl:
    import mla_torch

    def run(x: Inputs):
        return mla_torch.mla_decode(x.q, x.kv_cache, x.batch.metadata, x.batch.config, impl=impl)

    def unsupported(batch: Batch):
        try:
            return mla_torch.unsupported_reason(impl, batch.config, torch_device())
        except ImportError as e:  # a backend module not in this checkout
            return f"not importable: {e}"

    return Impl(f"torch.{impl}", run, unsupported, page_tail="finite" if impl == "fa3" else "nan")


def _jax_impl(impl: str) -> Impl:
    import mla_jax

    def run(x: Inputs):
        q, kv = x.jax_arrays()
        return mla_jax.mla_decode(q, kv, x.batch.metadata, x.batch.config, impl=impl)

    def unsupported(batch: Batch):
        try:
            return mla_jax.unsupported_reason(impl, batch.config, jax_device())
        except ImportError as e:  # a kernel module not in this checkout
            return f"not importable: {e}"

    return Impl(f"jax.{impl}", run, unsupported)


def jax_device():
    """The GPU the Pallas kernels run on, or None off a GPU (interpret mode, which counts as running)."""
    import jax

    return jax.devices()[0] if jax_on_gpu() else None


def _numpy_reference() -> Impl:
    from mla_spec import reference

    def run(x: Inputs):
        b = x.batch
        return reference.mla_decode(b.q, b.kv_cache, b.metadata, b.config)

    return Impl("numpy.reference", run, lambda batch: None)


def flashmla_unsupported_reason(config, query_lens=None) -> str | None:
    """Why FlashMLA cannot run this problem here (None: it can). FlashMLA takes page size
    64 only and one q_len for every request (q as [B, q_len, H, 576])."""
    if config.dtype not in ("bfloat16", "float16"):
        return f"FlashMLA takes bfloat16 or float16, got dtype={config.dtype!r}"
    if config.is_fp8_kv_cache:
        return f"the FlashMLA path here has no fp8 KV cache, got kv_cache_dtype={config.kv_cache_dtype!r}"
    if config.page_size != 64:
        return f"FlashMLA takes page_size 64 only, got page_size={config.page_size}"
    if (config.kv_lora_rank, config.qk_rope_head_dim) != (512, 64):
        return f"FlashMLA takes kv_lora_rank=512, qk_rope_head_dim=64, got {config.kv_lora_rank}, {config.qk_rope_head_dim}"
    if query_lens is not None and len(set(int(x) for x in query_lens)) > 1:
        return f"FlashMLA takes one q_len for every request (q as [B, q_len, H, 576]), got query_lens={tuple(query_lens)}"
    if not torch.cuda.is_available():
        return "FlashMLA needs a CUDA GPU; torch sees none"
    cap = torch.cuda.get_device_capability()
    if cap < (9, 0):
        return f"FlashMLA needs Hopper (sm90) or newer, got compute capability {cap}"
    try:
        flashmla_interface()
    except ImportError as e:
        return str(e)
    return None


def flashmla_decode(q: torch.Tensor, kv_cache: torch.Tensor, metadata, config):
    """One FlashMLA decode on the runner's inputs: q [T, H, 576] with one q_len per request,
    kv_cache [num_blocks, 64, 576]. Returns (out [T, H, 512], lse [T, H] float32)."""
    fm = flashmla_interface()
    qsl = np.asarray(metadata.query_start_loc)
    B, q_len = len(qsl) - 1, int(qsl[1] - qsl[0])
    T, H = int(q.shape[0]), int(q.shape[1])
    seq_lens = torch.as_tensor(np.asarray(metadata.seq_lens), dtype=torch.int32, device=q.device)
    block_table = torch.as_tensor(np.asarray(metadata.block_table), dtype=torch.int32, device=q.device)
    q4 = q.reshape(B, q_len, H, q.shape[-1])
    k4 = kv_cache.unsqueeze(2)  # [num_blocks, P, 1, 576]
    if "cache_seqlens" in inspect.signature(fm.get_mla_metadata).parameters:  # the older interface
        sched, splits = fm.get_mla_metadata(seq_lens, q_len * H, 1)
    else:  # the newer one fills its schedule on the first call
        sched, splits = fm.get_mla_metadata()
    out, lse = fm.flash_mla_with_kvcache(q4, k4, block_table, seq_lens, config.kv_lora_rank, sched, splits,
                                         softmax_scale=config.softmax_scale, causal=True)
    return out.reshape(T, H, config.kv_lora_rank), lse.permute(0, 2, 1).reshape(T, H)  # lse: [B, H, q_len]


def _flashmla_impl() -> Impl:
    def run(x: Inputs):
        return flashmla_decode(x.q, x.kv_cache, x.batch.metadata, x.batch.config)

    def unsupported(batch: Batch):
        return flashmla_unsupported_reason(batch.config, batch.scenario.query_lens)

    # Fed finite page tails as FA3 (a kernel that multiplies masked zeros by V rows); the
    # strict batch runs too and is recorded as for FA3.
    return Impl("torch.flashmla", run, unsupported, page_tail="finite")


def all_impls() -> dict[str, Impl]:
    impls = [
        _torch_impl("reference"),
        _torch_impl("fa3"),
        _flashmla_impl(),
        _numpy_reference(),
        _jax_impl("xla"),
        _jax_impl("pallas_triton"),
        _jax_impl("pallas_mosaic_gpu"),
    ]
    return {i.name: i for i in impls}


def default_impls() -> list[str]:
    """What `python -m parity` runs by default: on a GPU machine FA3, FlashMLA (where it
    imports) and the Pallas kernels against the torch reference, and FA3 against the others;
    on a CPU the Pallas kernels in interpret mode against the torch reference (plus the jnp
    reference)."""
    return [BASELINE, "torch.fa3", "torch.flashmla", "jax.xla", "jax.pallas_triton", "jax.pallas_mosaic_gpu"]


@dataclasses.dataclass
class Row:
    scenario: str
    dtype: str
    impl: str
    against: str
    status: str  # "pass" | "FAIL" | "skip" | "ERROR" | "known" (a documented limitation, not a failure)
    out: Comparison | None = None
    lse: Comparison | None = None
    note: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["out"] = self.out.as_dict() if self.out else None
        d["lse"] = self.lse.as_dict() if self.lse else None
        return d


# Cross-stack pairs checked directly (the two stacks agreeing is the point).
CROSS_PAIRS = [("torch.fa3", "jax.pallas_triton"), ("torch.fa3", "jax.pallas_mosaic_gpu"),
               ("torch.fa3", "torch.flashmla")]


def num_items(scenarios, dtypes, impl_names) -> int:
    """How many times `run_parity` calls `progress` (one per scenario, dtype and non-baseline impl)."""
    return len(scenarios) * len(dtypes) * sum(n != BASELINE for n in impl_names)


def check_comparable(impl_names) -> None:
    """Raises ValueError when `impl_names` holds nothing but the baseline: a parity run of the reference alone
    compares nothing (it would report 0 passed)."""
    if not any(n != BASELINE for n in impl_names):
        given = ", ".join(dict.fromkeys(impl_names)) or "none"
        raise ValueError(
            f"nothing to compare: the implementations given ({given}) are only the baseline {BASELINE}, and a "
            "reference alone has nothing to compare against; name at least one other implementation "
            "(python -m parity list)"
        )


def run_parity(
    scenarios: list[Scenario],
    dtypes: list[str],
    impl_names: list[str],
    *,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    impls = all_impls()
    unknown = [n for n in impl_names if n not in impls]
    if unknown:
        raise ValueError(f"unknown implementations {unknown}; known: {sorted(impls)}")
    check_comparable(impl_names)
    rows: list[Row] = []
    for sc in scenarios:
        for dtype in dtypes:
            batch = make_batch(sc, dtype, seed=seed)
            inputs = Inputs.make(batch)
            finite_tail_inputs = None
            ref_out, ref_lse = (_to_np(t) for t in impls[BASELINE].run(inputs))
            results: dict[str, tuple[np.ndarray, np.ndarray]] = {BASELINE: (ref_out, ref_lse)}
            for name in impl_names:
                if name == BASELINE:
                    continue
                if progress:
                    progress(f"{sc.name} {dtype} {name}")
                reason = impls[name].unsupported(batch)
                if reason is not None:
                    rows.append(Row(sc.name, dtype, name, BASELINE, "skip", note=reason))
                    continue
                note = ""
                impl_inputs = inputs
                if impls[name].page_tail == "finite":
                    if finite_tail_inputs is None:
                        finite_tail_inputs = Inputs.make(make_batch(sc, dtype, seed=seed, page_tail="finite"))
                    impl_inputs = finite_tail_inputs
                    note = "finite page tails"
                t0 = time.perf_counter()
                try:
                    out, lse = impls[name].run(impl_inputs)
                    out, lse = _to_np(out), _to_np(lse)
                except Exception as e:  # reported, and the run fails
                    rows.append(Row(sc.name, dtype, name, BASELINE, "ERROR", note=f"{type(e).__name__}: {e}"[:500]))
                    continue
                seconds = time.perf_counter() - t0
                results[name] = (out, lse)
                c_out, c_lse = compare_out_lse(out, lse, ref_out, ref_lse, dtype)
                status = "pass" if c_out.ok and c_lse.ok else "FAIL"
                rows.append(Row(sc.name, dtype, name, BASELINE, status, c_out, c_lse, note=note, seconds=seconds))
                if impls[name].page_tail == "finite":
                    rows.append(_strict_tail_row(impls[name], inputs, ref_out, ref_lse, sc.name, dtype))
            for a, b in CROSS_PAIRS:
                if a in results and b in results:
                    c_out, c_lse = compare_out_lse(*results[b], *results[a], dtype)
                    status = "pass" if c_out.ok and c_lse.ok else "FAIL"
                    rows.append(Row(sc.name, dtype, b, a, status, c_out, c_lse))
    return rows


def _strict_tail_row(impl: Impl, inputs: Inputs, ref_out, ref_lse, scenario: str, dtype: str) -> Row:
    """The same impl on the strict batch (NaN page tails): a known limitation when the
    output turns NaN, recorded (status "known") rather than failed; compared otherwise."""
    try:
        out, lse = (_to_np(t) for t in impl.run(inputs))
    except Exception as e:
        return Row(scenario, dtype, impl.name, BASELINE, "ERROR", note=f"NaN page tails: {type(e).__name__}: {e}"[:500])
    c_out, c_lse = compare_out_lse(out, lse, ref_out, ref_lse, dtype)
    if np.isnan(out).any() and np.isfinite(lse).all():
        tokens = int(np.isnan(out).any(axis=(1, 2)).sum())
        return Row(scenario, dtype, impl.name, BASELINE, "known", c_out, c_lse,
                   note=f"NaN page tails propagate to out of {tokens}/{out.shape[0]} tokens (0*NaN in P@V); lse clean")
    status = "pass" if c_out.ok and c_lse.ok else "FAIL"
    return Row(scenario, dtype, impl.name, BASELINE, status, c_out, c_lse, note="NaN page tails")


class Progress:
    """A tqdm bar of a long run on stderr: call it with each item as the item starts (the bar counts the items done and
    names the one running); `log(line)` prints a report line to stdout without breaking the bar; `enabled=False`
    (--quiet) shows nothing. Away from a terminal (a log file, CI) it redraws at most every 10 s."""

    def __init__(self, total: int, *, enabled: bool = True, unit: str = "case"):
        from tqdm import tqdm

        self._tqdm = tqdm
        tty = sys.stderr.isatty() if hasattr(sys.stderr, "isatty") else False
        self.bar = tqdm(total=max(int(total), 0), disable=not enabled, file=sys.stderr, unit=unit,
                        dynamic_ncols=True, leave=False, mininterval=0.1 if tty else 10.0)
        self.started = 0

    def __call__(self, what: str) -> None:
        self.bar.update(self.started - self.bar.n)
        self.started += 1
        self.bar.set_postfix_str(what)

    def log(self, line: str) -> None:
        self._tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()

    def close(self) -> None:
        self.bar.update(self.started - self.bar.n)
        self.bar.close()


def format_table(rows: list[Row]) -> str:
    head = f"{'scenario':<22} {'dtype':<8} {'impl':<24} {'vs':<16} {'out rel':>9} {'out cos':>12} {'lse abs':>9}  status"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.out is not None:
            nums = f"{r.out.rel_err:>9.2e} {r.out.cos_sim:>12.9f} {r.lse.max_abs_err:>9.2e}"
        else:
            nums = f"{'':>9} {'':>12} {'':>9}"
        status = r.status + (f" ({r.note})" if r.note else "")
        lines.append(f"{r.scenario:<22} {r.dtype:<8} {r.impl:<24} {r.against:<16} {nums}  {status}")
    return "\n".join(lines)


def environment() -> dict:
    import jax

    env = {
        "torch": torch.__version__,
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    return env


def default_scenarios() -> list[Scenario]:
    return list(SCENARIOS.values())
