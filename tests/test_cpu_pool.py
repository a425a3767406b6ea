"""XLA:CPU's thread pool (NPROC), widened for Mosaic GPU's interpreter by the processes that run it (`python -m parity`
and the tests), before JAX makes its CPU client, so that the interpreter does not hang on a machine with one or two
usable CPUs (parity/_cpu_pool.py); importing the library leaves the environment alone."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from parity._cpu_pool import INTERPRET_MIN_THREADS, usable_cpus, widen_cpu_pool


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


def test_conftest_set_nproc_here():
    """This process widened the pool before its first JAX computation (conftest): NPROC is set where it matters."""
    if usable_cpus() < INTERPRET_MIN_THREADS:
        assert "NPROC" in os.environ


def _python_on_one_cpu(code: str, timeout: float) -> subprocess.CompletedProcess:
    """`code` in a fresh CPU-only Python restricted to one usable CPU (set before JAX starts), NPROC and
    XLA_PYTHON_CLIENT_PREALLOCATE unset, from the checkout's root (as test_dcp's subprocess). Raises
    subprocess.TimeoutExpired past `timeout`."""
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    code = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n" + textwrap.dedent(code)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_importing_the_library_leaves_the_environment_alone():
    """On one CPU, where the CLI widens the pool: importing the packages (and the harness's modules) sets nothing."""
    done = _python_on_one_cpu("""
        before = dict(os.environ)
        import mla_spec, mla_jax, mla_torch, parity
        from parity import bench, compare, plots, runner, scenarios, shapes, timing
        import parity.__main__
        print("changed:", sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)))
    """, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "changed: []" in done.stdout, done.stdout


_ONE_CPU_RUN = """
    import runpy, sys
    sys.argv = ["python -m parity", "--scenarios", "heads_128", "--dtypes", "bfloat16", "--impls",
                "torch.reference,jax.pallas_mosaic_gpu", "--quiet"]
    runpy.run_module("parity", run_name="__main__", alter_sys=True)  # python -m parity: exits with its status
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_mosaic_interpreter_on_one_cpu_does_not_hang():
    """`python -m parity` on one CPU: the interpreted Mosaic kernel passes (~10 s). Without the pool widened by the
    CLI it hangs each time there (the waiting warpgroup holds the pool's only thread)."""
    try:
        done = _python_on_one_cpu(_ONE_CPU_RUN, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the interpreted Mosaic kernel on one CPU did not finish in 240 s (a hang): {e.stderr!r:.2000}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed, 0 failed" in done.stdout, done.stdout


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_cli_warns_where_jax_made_its_cpu_client_first():
    """A CPU client made before the CLI's main keeps its small pool: a RuntimeWarning names it and what to do."""
    done = _python_on_one_cpu("""
        import warnings
        import jax
        jax.numpy.zeros(1).block_until_ready()  # JAX makes its CPU client: a pool of one thread
        from parity.__main__ import main
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(["list"]) == 0
        print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    """, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "JAX made its CPU client before XLA:CPU's pool was widened" in done.stdout and "NPROC=8" in done.stdout
