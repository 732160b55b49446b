"""Lifeline: fault tolerance for large-model training on Kubernetes.

Parts (see DESIGN.md): ``api``, ``checkpoint``, ``sidecar``, ``runtime``, ``control``,
``operator``, ``launch``, ``devcluster``, ``models``. Every role runs from one image as
``python -m lifeline <role>``.
"""

from lifeline.errors import LifelineError

__version__ = "0.1.0"
__all__ = ["LifelineError", "__version__"]
