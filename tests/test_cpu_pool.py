"""mla_jax widens XLA:CPU's thread pool (NPROC) before JAX makes its CPU client, so that Mosaic GPU's interpreter does
not hang on a machine with one or two usable CPUs (mla_jax/_cpu_pool.py)."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from mla_jax._cpu_pool import INTERPRET_MIN_THREADS, usable_cpus, widen_cpu_pool


def test_widen_cpu_pool_sets_nproc_only_where_unset_and_cpus_are_few():
    env = {}
    with warnings.catch_warnings():  # (this process's CPU client may be made already: its warning is tested below)
        warnings.simplefilter("ignore", RuntimeWarning)
        assert widen_cpu_pool(env, cpus=2) == str(INTERPRET_MIN_THREADS)
    assert env == {"NPROC": str(INTERPRET_MIN_THREADS)}
    env = {"NPROC": "1"}  # the user's choice stands
    assert widen_cpu_pool(env, cpus=1) is None and env == {"NPROC": "1"}
    env = {}
    assert widen_cpu_pool(env, cpus=INTERPRET_MIN_THREADS) is None and env == {}
    assert usable_cpus() >= 1


def test_import_set_nproc_here():
    """This process imported mla_jax before its first JAX computation (conftest): NPROC is set where it matters."""
    if usable_cpus() < INTERPRET_MIN_THREADS:
        assert "NPROC" in os.environ


def _python_on_one_cpu(code: str, timeout: float) -> subprocess.CompletedProcess:
    """`code` in a fresh CPU-only Python restricted to one usable CPU (set before JAX starts), NPROC unset, from the
    checkout's root (as test_dcp's subprocess). Raises subprocess.TimeoutExpired past `timeout`."""
    env = {k: v for k, v in os.environ.items() if k != "NPROC"}
    env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    code = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n" + textwrap.dedent(code)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                          timeout=timeout)


_ONE_CPU_RUN = """
    from parity import runner  # as `python -m parity` does: parity's import sets NPROC (through mla_jax's)
    assert os.environ.get("NPROC") == "%d", os.environ.get("NPROC")
    from parity.scenarios import SCENARIOS
    print(runner.environment())  # (the CLI's header: JAX makes its CPU client here, before mla_decode)
    rows = runner.run_parity([SCENARIOS["heads_128"]], ["bfloat16"], [runner.BASELINE, "jax.pallas_mosaic_gpu"])
    print([(r.impl, r.status) for r in rows])
    assert [r.status for r in rows] == ["pass"], rows
""" % INTERPRET_MIN_THREADS


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_mosaic_interpreter_on_one_cpu_does_not_hang():
    """Without the NPROC set on import this hung each time on one CPU (the waiting warpgroup held the pool's only
    thread; session 40, and NPROC=1 on two CPUs); with it, ~10 s."""
    try:
        done = _python_on_one_cpu(_ONE_CPU_RUN, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the interpreted Mosaic kernel on one CPU did not finish in 240 s (a hang): {e.stderr!r:.2000}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "('jax.pallas_mosaic_gpu', 'pass')" in done.stdout


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_warns_where_jax_made_its_cpu_client_before_the_import():
    """A CPU client made before mla_jax's import keeps its small pool: a RuntimeWarning names it and what to do."""
    done = _python_on_one_cpu("""
        import warnings
        import jax
        jax.numpy.zeros(1).block_until_ready()  # JAX makes its CPU client: a pool of one thread
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import mla_jax
        print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    """, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "JAX made its CPU client before mla_jax was imported" in done.stdout and "NPROC=8" in done.stdout
