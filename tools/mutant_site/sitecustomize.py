"""Applies the mutant named by ``T2I_MUTANT`` (see ``tools/mutant_patches.py``) at interpreter start.

``tools/mutants.py`` puts this folder first on ``PYTHONPATH``, so every process of the test run
(pytest, ``python app.py`` subprocesses, Ray's workers) imports it and runs the same broken code.
"""

import os

if os.environ.get("T2I_MUTANT"):
    from tools.mutant_patches import apply

    apply(os.environ["T2I_MUTANT"])
