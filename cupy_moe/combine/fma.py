"""A float32 fused multiply-add in NumPy, rounded once, as the GPU's ``fma.rn.f32``.

NumPy has no fma, and computing ``a * b + c`` in float64 and casting to float32
rounds twice: the float64 sum may land exactly on a float32 tie that the
exact value is not on (e.g. ``c = 1 + 2**-23``, ``a * b = 2**-24 - 2**-70``:
float64 makes the tie ``1 + 1.5 * 2**-23``, which rounds up to even, while
the exact value lies below it and rounds down). ``fma_float32`` is exact:

1. ``prod = float64(a) * float64(b)`` is exact: two 24-bit significands make
   at most 48 bits (<= 53), and |prod| lies in [2**-298, 2**256), far inside
   float64's normal range (no overflow, no underflow).
2. ``s = prod + float64(c)`` rounds to nearest (RN53), and the TwoSum error
   ``err = (prod - (s - bb)) + (c - bb)`` with ``bb = s - prod`` is exact:
   ``prod + c == s + err`` (Knuth's TwoSum holds for any two finite floats
   whose sum does not overflow; every term here is a multiple of 2**-298 of
   magnitude below 2**257, so nothing overflows or leaves the grid).
3. Round-to-odd: where ``err != 0`` and ``s`` has an even last significand bit,
   step ``s`` one float64 ulp toward ``err`` (``np.nextafter``). The exact value
   ``v = s + err`` lies strictly between ``s`` and that neighbour (RN put ``s``
   nearest to it), and exactly one of the two is odd, so the result is
   ``RO53(v)``: ``v`` itself when representable, else the odd float64 of the
   two that bracket it.
4. ``float32(RO53(v))`` is ``RN24(v)``, one correct rounding. Let ``a < a + g``
   be the two float32 grid points around ``v`` (``g`` = 2**-149 among the
   denormals; past FLT_MAX the grid goes on with the last binade's spacing
   2**104, so ``a + g = 2**128`` and the midpoint is the overflow threshold
   2**128 - 2**103). float64's spacing there is at most ``g / 2**29`` (53 >=
   24 + 2 bits; float64 is still normal far below 2**-149), so ``a``, the
   midpoint ``a + g/2`` and ``a + g`` are float64 numbers with an *even* last
   bit. If ``v`` is one of them, RO53 returns it unchanged and the cast rounds
   it as RN24 would (a midpoint ties to even, or overflows). Otherwise
   RO53(v) is odd, so it is none of the three, and no float64 lies between
   ``v`` and it, so it sits in the same open half interval as ``v``: the cast
   picks the same float32 as RN24(v). (float64 binade boundaries are powers of
   two, which are grid points, so one float64 spacing holds inside
   ``(a, a + g)``.) The cast is C's double -> float: IEEE round to nearest
   even, gradual underflow, overflow to inf.

Special values. A zero sum is exact (``err == 0``): IEEE gives +0.0 unless both
``a * b`` and ``c`` are -0.0, and so does the float64 addition (and ``prod`` is
a zero of the right sign, being exact). A nonzero ``v`` that rounds to zero
keeps its sign through the cast. With an infinite or NaN operand ``s`` is not
finite, ``err`` is NaN, and ``s`` (float64 IEEE arithmetic: inf * 0, inf - inf
-> NaN, inf + finite -> inf) is taken as is; finite operands never give an
infinite ``prod`` or ``s``. Overflow comes only from the final cast. NaN
payloads are not specified (callers canonicalise NaN results).
"""

from __future__ import annotations

import numpy as np

__all__ = ["fma_float32"]

def fma_float32(a, b, c) -> np.ndarray:
    """``RN_float32(a * b + c)`` elementwise, one rounding (see the module).

    ``a``, ``b``, ``c``: float32 arrays or scalars (broadcast together).
    Returns a float32 array of the broadcast shape.
    """
    with np.errstate(all="ignore"):  # signalling NaNs, inf * 0, inf - inf, overflow
        a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
        b64 = np.asarray(b, dtype=np.float32).astype(np.float64)
        c64 = np.asarray(c, dtype=np.float32).astype(np.float64)
        prod = a64 * b64
        total = prod + c64
        bb = total - prod
        err = (prod - (total - bb)) + (c64 - bb)
        # (np.uint64(1): NumPy 1.x promotes a uint64 scalar & a Python int to float64)
        even = (total.view(np.uint64) & np.uint64(1)) == 0
        inexact = (err != 0) & np.isfinite(total) & even
        toward = np.where(err > 0, np.inf, -np.inf)
        odd = np.where(inexact, np.nextafter(total, toward), total)
        return np.asarray(odd.astype(np.float32))
