"""Shared fixtures. GPU-only tests mark and skip themselves (marker ``gpu``)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's id: reruns draw the same bits."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
