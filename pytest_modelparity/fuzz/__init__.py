"""Generated models and converter fuzzing: the draw of a model (``model_steps``, ``model_draw``),
one drawn model through each converter (``fuzzing``) in a child process (``fuzz_worker``), the
catalogue of known converter defects and their status here, the shrink and the reproducers.

A room of its own, as Hypothesis keeps its strategies apart from its engine: ``checks`` holds the
assertions a test calls, this folder the campaign that exercises the converters with them.
Imports ``checks``, ``formats``, ``floor``, ``runtime`` and ``verdict``; never ``plugin``.
"""
