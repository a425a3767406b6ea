"""tools/smem.py (a design aid): Mosaic GPU's own count of the kernel's shared memory, lowered for an H200 on the CPU,
stays within the 227 KiB a Hopper block may opt into for the kernel's layouts."""

import pytest

from tools import smem


def test_the_bf16_kernel_fits():
    nbytes, _ = smem.kernel_smem_bytes(128)
    assert 220 * 1024 < nbytes <= smem.SMEM_OPTIN_BYTES  # q and 2 stages nearly fill it


def test_fp8_leaves_room_at_16_heads():
    """The fp8 layout at H = 16, q_len 1 (transposed scores and P @ V, the overlapped conversion): under the limit,
    and larger than the 16-bit one at the same tuning (the fp8 ring beside the f16 buffers)."""
    fp8, tuning = smem.kernel_smem_bytes(16, fp8=True)
    assert tuning.transpose == "scores_and_pv"
    bf16, _ = smem.kernel_smem_bytes(16, sets={"transpose": "scores_and_pv"})
    assert bf16 < fp8 <= smem.SMEM_OPTIN_BYTES


def test_cli_and_bad_sets(capsys):
    assert smem.main(["--heads", "128"]) == 0
    assert "bytes" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no field nope"):
        smem.main(["--heads", "128", "--set", "nope=1"])
