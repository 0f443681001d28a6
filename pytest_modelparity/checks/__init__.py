"""The checks a test calls: the assertions, quantised verdicts, the noise floor they measure,
Hypothesis strategies and real rows.

Imports ``reports`` (the emit point), ``diagnose``, ``formats``, ``runtime`` and ``verdict``;
never ``plugin``.
"""
