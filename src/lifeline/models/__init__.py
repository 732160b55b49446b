"""lifeline.models — reference trainers used by examples, tests and benchmarks.

* :mod:`lifeline.models.gpt_moe` — a GPT with Mixture-of-Experts layers, pipeline and data parallel.
"""

__all__: list[str] = []
