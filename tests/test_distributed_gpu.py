"""Expert parallelism on CUDA tensors (marker ``gpu``): the checks of
tests/distributed_cases.py with every tensor on a GPU.

- gloo, 2 and 4 ranks: rank r on GPU r % count, so the ranks share one GPU
  where only one is lent (gloo moves CUDA tensors through host memory). Every
  library step of dispatch, combine and the expert-parallel layer runs on
  the GPU, against the same oracles as on the CPU; the transport is gloo's.
- NCCL, one rank (NCCL takes a GPU a rank, so one GPU holds one): the same
  calls over NCCL's all-to-all (to itself), every check that one rank can
  make (not those that need ranks to disagree).

Each job's processes start from a forkserver that has not touched CUDA.
"""

from __future__ import annotations

import pytest
from distributed_cases import CHECKS, run_checks
from gpu_cases import GPU_MARKS, HAS_TORCH_CUDA

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = GPU_MARKS + [pytest.mark.skipif(not HAS_TORCH_CUDA,
                                             reason="needs torch with CUDA")]

# checks about ranks that disagree: they need two ranks at least
NEEDS_TWO_RANKS = ("errors", "one_rank_refuses")
ONE_RANK_CHECKS = [name for name in CHECKS if name not in NEEDS_TWO_RANKS]


def _fail_if_failed(job, check):
    failure = job[check]
    if failure is not None:
        pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def gloo_cuda_job(request):
    """Every check of CHECKS on CUDA tensors over gloo, once per group size."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no torch.distributed with gloo")
    return run_checks(request.param, list(CHECKS), backend="gloo", device="cuda")


@pytest.mark.parametrize("check", list(CHECKS))
def test_gloo_on_cuda_tensors(gloo_cuda_job, check):
    _fail_if_failed(gloo_cuda_job, check)


@pytest.fixture(scope="module")
def nccl_job():
    """The one-rank checks over NCCL."""
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    return run_checks(1, ONE_RANK_CHECKS, backend="nccl", device="cuda")


@pytest.mark.parametrize("check", ONE_RANK_CHECKS)
def test_nccl_one_rank(nccl_job, check):
    _fail_if_failed(nccl_job, check)
