"""What PTX and ptxas report (registers, spills, serialized wgmmas) does the Mosaic GPU kernel get for an H200, on a
machine with no GPU? The kernel is lowered for an abstract H200 with the heuristic's tuning (`--set` replaces fields)
and handed to Mosaic GPU's own compiler behind a stand-in CUDA driver; it needs JAX's CUDA plugin in a venv of its
own, gcc and a ptxas. From the checkout's root: `python -m tools.mosaic_ptx --shape H16_B128_S16384_q1 --fp8 --out
/tmp/ptx` or `python -m tools.mosaic_ptx --grid fp8 --fp8`.
"""

from __future__ import annotations

DETAILS = """The kernel is lowered for an abstract H200 (`parity.h200`) on a bench shape with the heuristic's tuning (`--set`
replaces fields, as tools/sweep.py's), and its Mosaic GPU module is handed to Mosaic GPU's own compiler, the
`MosaicGpuCompile` of JAX's CUDA plugin: the same passes, LLVM and ptxas call as on the GPU machine. The compiler
asks the CUDA driver only for the device's compute capability before it writes the PTX and runs ptxas; a stand-in
`libcuda.so.1` (built here with gcc, loaded before the plugin) answers 9.0 and fails everything after, so the
kernel is never loaded. Needs, beside the project: the plugin (`pip install jax-cuda13-plugin==0.11.2`, which brings
jax-cuda13-pjrt, about 140 MB, no NVIDIA libraries; in a venv of its own, so that the tests' JAX sees no CUDA
plugin), gcc, and a ptxas (the first on PATH, else under /usr/local/cuda*, else Triton's; the
plugin picks the PTX ISA version that ptxas reads: CUDA 13's gives the GPU machine's PTX). Checked against the GPU
machine: for the heuristic at H16 B128 S16384 fp8 this gives the PTX that the GPU machine dumps, line for line but the debug locations, and CUDA 13.0's ptxas here the same report (240
registers, no spills).

    python -m tools.mosaic_ptx --shape H16_B128_S16384_q1 --fp8 --set pv_in_flight=1 --out /tmp/ptx
    python -m tools.mosaic_ptx --grid fp8 --fp8

writes <out>/<shape>[-fp8][-<set>].ptx.gz and .ptxas per kernel and prints ptxas's registers, spills and its
warnings (a wgmma serialized: C7514 / C7515 / C7520 ...); `python -m tools.mosaic_sass <ptx.gz>` reads the loops'
machine code. A static view for choosing what to time, not a timing.
"""

import argparse
import ctypes
import glob
import gzip
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The stand-in driver: the compute capability of an H200 (9.0), and an error string; nothing else is defined, so
# any other call (loading the module, launching) fails in the plugin's lazy stubs instead of running.
SHIM_C = r"""
typedef int CUresult;
static const char *message = "tools/mosaic_ptx.py: no GPU (a stand-in libcuda)";
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuCtxGetDevice(int *device) { *device = 0; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int device) {
  if (attribute == 75) { *v = 9; return 0; }  /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  if (attribute == 76) { *v = 0; return 0; }  /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */
  return 1;
}
CUresult cuGetErrorString(CUresult e, const char **s) { *s = message; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = message; return 0; }
"""

_OTHER_DUMPS = ("MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_SASS", "MOSAIC_GPU_DUMP_SASS_CTRL", "MOSAIC_GPU_DUMP_LLVM",
                "MOSAIC_GPU_DUMP_HOST_LLVM", "MOSAIC_GPU_DUMP_MLIR_PASSES", "MOSAIC_GPU_DUMP_RESOURCES")
_WARNING = re.compile(r"ptxas.*(warning|Performance|serializ|C75\d\d)", re.I)


def plugin_library() -> str:
    """The path of JAX's CUDA plugin library (it exports MosaicGpuCompile), found without importing it."""
    for name in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is not None and spec.origin:
            path = os.path.join(os.path.dirname(spec.origin), "xla_cuda_plugin.so")
            if os.path.exists(path):
                return path
    raise RuntimeError("JAX's CUDA plugin is not installed: pip install jax-cuda13-plugin==0.11.2 (in a venv of its "
                       "own; no GPU or NVIDIA libraries needed)")


def ptxas_dir() -> str:
    """A folder holding a ptxas: the first on PATH, else under /usr/local/cuda* (the newest name first), else the
    installed Triton's."""
    found = [shutil.which("ptxas")] + sorted(glob.glob("/usr/local/cuda*/bin/ptxas"), reverse=True)
    try:
        import triton

        found.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))
    except ImportError:
        pass
    for path in filter(None, found):
        if os.path.exists(path):
            return os.path.dirname(os.path.realpath(path))
    raise RuntimeError("no ptxas: put CUDA's bin on PATH or install triton")


_DRIVER_LOADED = []  # (the stand-in's path, once loaded in this process)


def load_stand_in_driver(workdir: str) -> None:
    """Builds SHIM_C as libcuda.so.1 (its soname) and loads it globally: the plugin's dlopen of libcuda.so.1 then
    finds it already loaded. Once a process (it stays loaded: run this in a process of its own)."""
    if _DRIVER_LOADED:
        return
    if shutil.which("gcc") is None:
        raise RuntimeError("gcc is needed to build the stand-in libcuda.so.1")
    src, lib = os.path.join(workdir, "shim.c"), os.path.join(workdir, "libcuda.so.1")
    with open(src, "w") as f:
        f.write(SHIM_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, src], check=True)
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    _DRIVER_LOADED.append(lib)


def compile_module(compile_fn, module: bytes, workdir: str) -> tuple[str, str]:
    """(PTX, ptxas's report) of one Mosaic GPU module, read from what the compiler writes to stdout with
    MOSAIC_GPU_DUMP_PTX / _PTXAS set (its loading the kernel then fails, as it must without a GPU)."""
    env = {"MOSAIC_GPU_DUMP_PTX": "1", "MOSAIC_GPU_DUMP_PTXAS": "1"}
    saved = {k: os.environ.get(k) for k in (*env, *_OTHER_DUMPS)}
    os.environ.update(env)
    for k in _OTHER_DUMPS:  # (DUMP_TO would dump every pass's IR too; the others would mix into the stdout read)
        os.environ.pop(k, None)
    out_path, err_path = os.path.join(workdir, "stdout.txt"), os.path.join(workdir, "stderr.txt")
    sys.stdout.flush()
    sys.stderr.flush()
    fds = {1: os.dup(1), 2: os.dup(2)}  # (the compiler's stdout read back; its log kept off the screen)
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            compile_fn(module, len(module))  # (returns null: the stand-in driver cannot load the kernel)
            ctypes.CDLL(None).fflush(None)
    finally:
        for fd, copy in fds.items():
            os.dup2(copy, fd)
            os.close(copy)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    with open(out_path, errors="replace") as f:
        text = f.read()
    start = text.find("//\n// Generated by LLVM NVPTX Back-End")
    cut = re.search(r"^ptxas", text[start:], flags=re.M) if start >= 0 else None
    if start < 0 or cut is None:
        with open(err_path, errors="replace") as f:
            log = f.read()
        raise RuntimeError(f"Mosaic GPU's compiler wrote no PTX and ptxas report:\n{text[-2000:]}\n{log[-3000:]}")
    return text[start:start + cut.start()], text[start + cut.start():]


def report(ptxas: str) -> dict:
    """{registers, spill_stores, spill_loads, stack, warnings} from ptxas -v's report."""
    regs = re.search(r"Used (\d+) registers", ptxas)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", ptxas)
    return {"registers": int(regs.group(1)) if regs else -1,
            "stack": int(frame.group(1)) if frame else -1,
            "spill_stores": int(frame.group(2)) if frame else -1,
            "spill_loads": int(frame.group(3)) if frame else -1,
            "warnings": [line.strip() for line in ptxas.splitlines() if _WARNING.search(line)]}


def ptx_for(problem, overrides: dict | None = None, page: int = 64, module=None) -> list[dict]:
    """Per Mosaic GPU kernel of one call on `problem` ((heads, batch, seq_len, q_len, fp8)) with the heuristic's
    tuning and `overrides`: {"ptx", "ptxas", **report(ptxas)}. module: the mla_jax.pallas_mosaic_gpu to lower
    (default the package's)."""
    from parity.h200 import lowered_modules

    library = plugin_library()
    with tempfile.TemporaryDirectory() as workdir:
        load_stand_in_driver(workdir)
        tool_dir = ptxas_dir()
        if not os.environ.get("PATH", "").startswith(tool_dir + os.pathsep):  # (once a process)
            os.environ["PATH"] = tool_dir + os.pathsep + os.environ.get("PATH", "")
        compile_fn = ctypes.CDLL(library).MosaicGpuCompile
        compile_fn.argtypes = [ctypes.c_char_p, ctypes.c_int]
        compile_fn.restype = ctypes.c_void_p
        out = []
        for _, bytecode in lowered_modules(problem, module, dict(overrides or {}), page):
            ptx, ptxas = compile_module(compile_fn, bytecode, workdir)
            out.append({"ptx": ptx, "ptxas": ptxas, **report(ptxas)})
    return out


def main(argv=None) -> int:
    from parity.shapes import GRIDS, parse_shape
    from tools.sweep import parse_overrides

    p = argparse.ArgumentParser(prog="python -m tools.mosaic_ptx", description=__doc__, epilog=DETAILS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--shape", type=lambda t: [parse_shape(x) for x in t.split(",")],
                      help="bench shapes, comma-separated, e.g. H16_B128_S16384_q1,H16_B64_S4096_q2")
    what.add_argument("--grid", choices=sorted(GRIDS), help="every shape of a bench grid")
    p.add_argument("--fp8", action="store_true", help="an fp8_e4m3 cache (default bf16)")
    p.add_argument("--set", dest="overrides", type=parse_overrides, default={},
                   help="MosaicConfig fields replaced in the heuristic's pick (as tools/sweep.py's --set)")
    p.add_argument("--out", help="write each kernel's PTX (.ptx.gz) and ptxas report (.ptxas) here")
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        plugin_library()
        ptxas_dir()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    failed = 0
    for s in args.shape or GRIDS[args.grid]:
        if s.ragged:  # (a problem tuple is a uniform batch: its kernels would be the twin's)
            print(f"{s.name}: not lowered: a ragged shape (this tool lowers uniform batches; its uniform twin: "
                  f"{s.uniform_twin().name})")
            continue
        problem = (s.num_heads, s.batch, s.seq_len, s.q_len, args.fp8)
        try:
            kernels = ptx_for(problem, args.overrides, page=s.page_size)
        except (ValueError, NotImplementedError, RuntimeError) as e:  # (a tuning the shape refuses; no PTX)
            print(f"{s.name}: {type(e).__name__}: {e}")
            failed += 1
            continue
        name = s.name + ("-fp8" if args.fp8 else "") + "".join(f"-{k}={v}" for k, v in args.overrides.items())
        for i, k in enumerate(kernels):
            print(f"{name} kernel {i}: {k['registers']} registers, {k['spill_stores']} bytes spill stores, "
                  f"{k['spill_loads']} loads, {k['stack']}-byte stack frame")
            for w in k["warnings"]:
                if "spilled" not in w:
                    print(f"  {w}")
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                base = os.path.join(args.out, name if len(kernels) == 1 else f"{name}-{i}")
                with gzip.open(base + ".ptx.gz", "wt") as f:
                    f.write(k["ptx"])
                with open(base + ".ptxas", "w") as f:
                    f.write(k["ptxas"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
