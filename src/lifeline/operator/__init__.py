"""The TrainingJob operator (kopf): observe pods, nodes and the catalog; apply ``lifeline.control``'s decisions.

Modules: :mod:`~lifeline.operator.handlers` (kopf glue), :mod:`~lifeline.operator.reconcile`
(observe → decide → act → status), :mod:`~lifeline.operator.observe`,
:mod:`~lifeline.operator.decide`, :mod:`~lifeline.api.manifests` (the per-rank Pod and the
job Secret), :mod:`~lifeline.operator.status`, :mod:`~lifeline.operator.spec`,
:mod:`~lifeline.operator.recorded`, :mod:`~lifeline.operator.events`,
:mod:`~lifeline.operator.metrics`, :mod:`~lifeline.operator.settings`. Run it with
``python -m lifeline operator``; see docs/operator.md.
"""
