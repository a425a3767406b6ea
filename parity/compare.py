"""The comparator: NaN/Inf positions must match, then relative-norm error, max abs
error, cosine similarity and the position of the worst element."""

from __future__ import annotations

import dataclasses

import numpy as np

# Tolerances of the harness, per dtype of the inputs. Out: relative norm error
# ||a - b|| / ||b|| and cosine similarity. LSE: max abs error (natural log units).
# For scale: FA3 vs an fp32 reference on the H200 measured out 1.8e-3, LSE 4e-6 (bf16);
# a bf16 rounding of out alone costs about 1.1e-3 in relative norm.
TOLERANCES = {
    "float32": dict(out_rel=1e-5, out_cos=1 - 1e-9, lse_abs=1e-4),
    "float16": dict(out_rel=2e-3, out_cos=1 - 1e-5, lse_abs=1e-3),
    "bfloat16": dict(out_rel=8e-3, out_cos=1 - 1e-4, lse_abs=1e-3),
}


@dataclasses.dataclass(frozen=True)
class Comparison:
    name: str
    ok: bool
    rel_err: float
    max_abs_err: float
    cos_sim: float
    worst_index: tuple[int, ...] | None
    message: str

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d


def compare(actual, expected, *, name: str = "out", rel_tol: float | None = None, abs_tol: float | None = None,
            cos_tol: float | None = None) -> Comparison:
    """Compares `actual` to `expected` (float64 math). Passes when NaN/Inf positions match,
    and each given tolerance holds: rel_tol on ||a-b||/||b||, abs_tol on max|a-b|,
    cos_tol as the least cosine similarity."""
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    if a.shape != b.shape:
        return Comparison(name, False, np.inf, np.inf, 0.0, None, f"{name}: shape {a.shape} != expected {b.shape}")
    for kind, fa, fb in (("NaN", np.isnan(a), np.isnan(b)), ("+Inf", np.isposinf(a), np.isposinf(b)),
                         ("-Inf", np.isneginf(a), np.isneginf(b))):
        if not np.array_equal(fa, fb):
            idx = tuple(int(i) for i in np.argwhere(fa != fb)[0])
            return Comparison(
                name, False, np.inf, np.inf, 0.0, idx,
                f"{name}: {kind} positions differ ({int((fa != fb).sum())} elements), first at {idx}: "
                f"actual={a[idx]}, expected={b[idx]}",
            )
    finite = np.isfinite(b)
    da = np.where(finite, a, 0.0)
    db = np.where(finite, b, 0.0)
    diff = np.abs(da - db)
    norm_b = float(np.linalg.norm(db))
    rel = float(np.linalg.norm(da - db)) / norm_b if norm_b > 0 else float(np.linalg.norm(da - db))
    max_abs = float(diff.max()) if diff.size else 0.0
    denom = float(np.linalg.norm(da)) * norm_b
    cos = float((da * db).sum()) / denom if denom > 0 else (1.0 if np.array_equal(da, db) else 0.0)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape)) if diff.size else None
    failures = []
    if rel_tol is not None and not rel <= rel_tol:
        failures.append(f"rel_err={rel:.3g} > {rel_tol:.3g}")
    if abs_tol is not None and not max_abs <= abs_tol:
        failures.append(f"max_abs_err={max_abs:.3g} > {abs_tol:.3g}")
    if cos_tol is not None and not cos >= cos_tol:
        failures.append(f"cos_sim={cos:.9f} < {cos_tol:.9f}")
    where = f"worst at {worst}: actual={a[worst]:.6g}, expected={b[worst]:.6g}" if worst is not None else "empty"
    msg = f"{name}: rel_err={rel:.3g} max_abs_err={max_abs:.3g} cos_sim={cos:.9f}; {where}"
    if failures:
        msg = f"{name} FAILED ({'; '.join(failures)}): {msg}"
    return Comparison(name, not failures, rel, max_abs, cos, worst, msg)


def compare_out_lse(out, lse, ref_out, ref_lse, dtype: str) -> tuple[Comparison, Comparison]:
    """Out and LSE against a reference with the harness tolerances for `dtype`."""
    tol = TOLERANCES[dtype]
    return (
        compare(out, ref_out, name="out", rel_tol=tol["out_rel"], cos_tol=tol["out_cos"]),
        compare(lse, ref_lse, name="lse", abs_tol=tol["lse_abs"]),
    )
