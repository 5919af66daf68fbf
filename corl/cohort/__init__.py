"""The cohort: building members of different families, warming them up, and evaluating them.

Submodules import torch/transformers; import them where needed (``corl.cohort.build``,
``corl.cohort.evaluate``). ``corl.cohort.metrics`` and ``corl.cohort.manifest`` are light.
``corl.cohort.packaged`` fetches and converts real models that ship in PyPI packages (``smol``).
"""
