"""The runtime every op family shares: array kinds and their descriptions,
argument rules, the NVRTC loader, kernel launches and the torch fast path.

Nothing here knows an op; the families (``cupy_moe.expand``, ...) build on it.
"""
