"""The benchmark harness: manifest, inputs, timing, peers, runner, report, CLI.

Not imported by the ops: ``import cupy_moe`` and an op call never load it, so
PyYAML, torch and matplotlib stay out of the op path.
"""
