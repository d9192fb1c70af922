"""``specframe bench``: strategies compared side by side on Spec-Bench-format questions.

Modules: ``config`` (the YAML schema), ``peers`` (HF transformers baselines in the same process),
``runner`` (interleaved runs,
lossless check), ``report`` (results.json, report.md, rich table), ``plots`` (PNG figures). The cost curve
v(n) and predicted speedups come from :mod:`specframe.target.cost`.
"""
