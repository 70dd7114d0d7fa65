"""Test helpers shared by the CPU and GPU test files.

Everything here works on NumPy arrays (device tests copy to and from the host
around these). The oracle is a plain loop over slots, written independently
of ``cupy_moe.reference`` (which is the code under test).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from cupy_moe.harness.inputs import numpy_dtype as np_dtype
from cupy_moe.harness.inputs import random_bits
from cupy_moe.reference import fused_mapping_numpy
from cupy_moe.runtime.sizes import align_up, ceil_div  # noqa: F401 - re-exported for the tests


def bits(array: np.ndarray) -> np.ndarray:
    """The raw bits of ``array`` as same-size unsigned ints (any strides)."""
    return array.view(f"u{array.dtype.itemsize}")


class GivenPosToToken:
    """A kernel path (conftest's KERNEL_PATHS) whose calls of either op pass
    ``pos_to_token`` (each row's token, drawn from the call's own map) under
    ``tuning``."""

    def __init__(self, tuning) -> None:
        self.tuning = tuning


# --- routing maps -------------------------------------------------------------

def make_topk_ids(num_tokens: int, top_k: int, num_experts: int, *,
                  invalid_every: int | None = None, rng=None) -> np.ndarray:
    """[T, K] expert ids: random when ``rng`` is given, else (3t + 5k) % E.

    ``invalid_every=n`` drops the last slot (-1) of every n-th token.
    """
    if rng is None:
        t = np.arange(num_tokens).reshape(-1, 1)
        k = np.arange(top_k).reshape(1, -1)
        topk_ids = (3 * t + 5 * k) % num_experts
    else:
        topk_ids = rng.integers(0, num_experts, size=(num_tokens, top_k))
    topk_ids = topk_ids.astype(np.int32)
    if invalid_every is not None and num_tokens > 0:
        topk_ids[::invalid_every, -1] = -1
    return topk_ids


def make_expert_major_routing(topk_ids: np.ndarray, num_experts: int,
                              block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(token_topk_to_pos [T, K], pos_to_expert [X]), both int32: the library's
    NumPy routing plan (experts one after the other, each padded to a multiple
    of ``block_size``; within an expert, ascending t*K+k)."""
    plan = fused_mapping_numpy(topk_ids, num_experts, alignment=block_size)
    return plan.token_topk_to_pos, plan.pos_to_expert


def make_manifest_routing(num_tokens: int, top_k: int,
                          num_expanded: int) -> tuple[np.ndarray, np.ndarray]:
    """The seed's shape-driven map: slot i -> row i for the first min(T*K, X)
    slots (expert i % 16), every other slot dropped and every other row padding."""
    used = min(num_tokens * top_k, num_expanded)
    token_topk_to_pos = np.full(num_tokens * top_k, -1, dtype=np.int32)
    token_topk_to_pos[:used] = np.arange(used)
    pos_to_expert = np.full(num_expanded, -1, dtype=np.int32)
    pos_to_expert[:used] = np.arange(used) % 16
    return token_topk_to_pos.reshape(num_tokens, top_k), pos_to_expert


# --- payloads -----------------------------------------------------------------

def random_payload(rng, shape, dtype) -> np.ndarray:
    """An array of ``dtype`` filled with random bits: every code of the type can
    appear (NaN encodings, -0.0, infinities, subnormals)."""
    return random_bits(rng, tuple(shape), np_dtype(dtype))


def from_bits(codes, dtype) -> np.ndarray:
    """An array of ``dtype`` holding the given raw bit patterns."""
    dtype = np_dtype(dtype)
    return np.asarray(codes, dtype=f"u{dtype.itemsize}").view(dtype)


# --- oracle and comparison ----------------------------------------------------

def oracle_expand(x: np.ndarray, token_topk_to_pos: np.ndarray,
                  pos_to_expert: np.ndarray, *,
                  padding_rows_from: np.ndarray | None = None) -> np.ndarray:
    """Expected output of a well-formed map, by a loop over the slots.

    Works for the activations and for the scale factors alike (``x`` is any
    [T, C] array); the copy is of raw bits. Returns a C-contiguous [X, C]
    array of ``x``'s dtype. Padding rows are zero; given
    ``padding_rows_from`` (the [X, C] contents an output held before a
    ``zero_padding=False`` call), they hold its bits instead.
    """
    num_tokens, top_k = token_topk_to_pos.shape
    expected = np.zeros((pos_to_expert.shape[0], x.shape[1]), dtype=x.dtype)
    out_bits, x_bits = bits(expected), bits(x)
    for t in range(num_tokens):
        for k in range(top_k):
            p = int(token_topk_to_pos[t, k])
            if p >= 0:
                out_bits[p] = x_bits[t]
    for p in range(pos_to_expert.shape[0]):
        if pos_to_expert[p] < 0:
            out_bits[p] = 0 if padding_rows_from is None else bits(padding_rows_from)[p]
    return expected


# Every byte of a poisoned output: what a padding row left alone still holds.
POISON_BYTE = 0xAB


def poisoned(shape, dtype) -> np.ndarray:
    """An array of ``dtype`` with every byte POISON_BYTE."""
    dtype = np_dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return np.full(count * dtype.itemsize, POISON_BYTE, np.uint8).view(dtype).reshape(shape)


def assert_expert_rows_equal(actual: np.ndarray, expected: np.ndarray,
                             pos_to_expert: np.ndarray, what: str = "array") -> None:
    """Rows with ``pos_to_expert >= 0`` bit for bit; padding rows unchecked (a
    fresh output of a ``zero_padding=False`` call holds anything there)."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    rows = np.asarray(pos_to_expert) >= 0
    assert_bits_equal(actual[rows], expected[rows], f"{what} (expert rows)")


def assert_bits_equal(actual: np.ndarray, expected: np.ndarray, what: str = "array") -> None:
    """Same shape, item size and bits; a mismatch names its first coordinate."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype.itemsize == expected.dtype.itemsize, (
        f"{what}: dtype {actual.dtype} != {expected.dtype}")
    a, e = bits(actual), bits(expected)
    if np.array_equal(a, e):
        return
    first = tuple(int(i) for i in np.argwhere(a != e)[0])
    count = int(np.count_nonzero(a != e))
    width = 2 * actual.dtype.itemsize
    raise AssertionError(
        f"{what}: {count} element(s) differ; first at {first}: "
        f"got {int(a[first]):#0{width + 2}x}, expected {int(e[first]):#0{width + 2}x}")


# --- CPU torch tensors (bit-preserving, independent of cupy_moe._arrays) ------

_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def to_torch(array: np.ndarray):
    """A CPU tensor of the same dtype (torch's native bf16 / fp8) and bits."""
    import torch

    array = np.ascontiguousarray(array)
    carrier = torch.from_numpy(array.view(_INT_OF_SIZE[array.dtype.itemsize]).copy())
    return carrier.view(getattr(torch, array.dtype.name))


def from_torch(tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's bits (same shape and strides), typed
    with the NumPy dtype of the same name."""
    import torch

    name = str(tensor.dtype).removeprefix("torch.")
    carrier = getattr(torch, _INT_OF_SIZE[tensor.element_size()])
    return tensor.view(carrier).numpy().view(np_dtype(name))


def nvrtc_or_skip() -> None:
    """Skip a compile test where NVRTC cannot be loaded; under CI=true (which
    installs the cuda12 extra) fail instead, so a broken kernel never passes
    for want of a compiler."""
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - no CuPy, or no libnvrtc found
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must be able to run NVRTC (install the cuda12 extra): {exc}")
        pytest.skip(f"NVRTC not available: {exc}")


def cubin_code(cubin: bytes) -> dict[str, bytes]:
    """Kernel name -> its machine code (the ELF section ``.text.<name>``) of a
    cubin: what tells whether two modules compiled a kernel alike."""
    import struct

    table_offset, = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, align, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, table_offset + i * entry_size)
                for i in range(count)]
    names_offset = sections[names_index][4]
    code = {}
    for name, _, _, _, offset, size, *_ in sections:
        start = names_offset + name
        section = cubin[start:cubin.index(b"\0", start)].decode()
        if section.startswith(".text."):
            code[section.removeprefix(".text.")] = cubin[offset:offset + size]
    return code
