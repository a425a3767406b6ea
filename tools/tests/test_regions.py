"""python -m tools.regions: the Mosaic GPU profiler's trace summarized per warpgroup role (CPU: a synthetic trace)."""

import pytest

from tools import regions


def _trace():
    def rng(tid, name, b, e):
        return [{"ph": "B", "name": name, "ts": b, "tid": tid, "pid": 0},
                {"ph": "E", "name": name, "ts": e, "tid": tid, "pid": 0}]

    ev = []
    for tid in (0, 2):  # warpgroup 0 of two blocks: 2 steps each, kv_wait + qk + pv
        for k in range(2):
            t = 10.0 * k
            ev += rng(tid, "kv_wait", t, t + 1) + rng(tid, "qk", t + 1, t + 4) + rng(tid, "pv", t + 5, t + 7)
    for k in range(3):  # warpgroup 1 of one block: 3 steps (its buffer holds more of them)
        t = 10.0 * k
        ev += rng(1, "p_ready_wait", t, t + 5) + rng(1, "pv", t + 5, t + 8)
    ev.append({"ph": "M", "name": "thread_name", "tid": 1, "pid": 0})  # metadata events are ignored
    return {"traceEvents": ev}


def test_summarize_groups_traces_by_role_and_averages_each_region_over_its_own_count():
    out = regions.summarize(_trace())
    assert set(out) == {"kv_wait+pv+qk", "p_ready_wait+pv"}
    wg0, wg1 = out["kv_wait+pv+qk"], out["p_ready_wait+pv"]
    assert wg0["traces"] == 2 and wg1["traces"] == 1
    assert wg0["regions"]["qk"] == {"mean_us": 3.0, "count": 2.0}
    assert wg0["regions"]["pv"]["mean_us"] == 2.0 and wg0["span_us"] == 17.0
    # warpgroup 1's pv: its own 3 ranges, not divided by warpgroup 0's step count
    assert wg1["regions"]["pv"] == {"mean_us": 3.0, "count": 3.0}
    assert wg1["regions"]["p_ready_wait"]["mean_us"] == 5.0


def test_summarize_by_warpgroup_index():
    # the profiler's thread ids: 1 + warpgroup + 2 x block; warpgroups 0 of both blocks are tids 1 and 3
    tr = _trace()
    for e in tr["traceEvents"]:
        e["tid"] = {0: 1, 2: 3, 1: 2}[e["tid"]]
    out = regions.summarize(tr, warpgroups=2)
    assert set(out) == {"wg0", "wg1"}
    assert out["wg0"]["traces"] == 2 and out["wg0"]["regions"]["qk"]["count"] == 2.0
    assert out["wg1"]["regions"]["pv"] == {"mean_us": 3.0, "count": 3.0}


def test_parse_sets():
    assert regions.parse_sets("warpgroup_halves=True,num_splits=2,pv_in_flight=1,ring_pairs=False") == {
        "warpgroup_halves": True, "num_splits": 2, "pv_in_flight": 1, "ring_pairs": False}
    with pytest.raises(ValueError, match="'num_splits'"):
        regions.parse_sets("num_splits")


def test_main_without_a_gpu_says_so(capsys):
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is here")
    assert regions.main(["--shapes", "H128_B2_S1024_q1"]) == 2
    assert "needs a GPU" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        regions.main(["--shapes", "H128_B2_S1024_q1", "--space", "0"])
