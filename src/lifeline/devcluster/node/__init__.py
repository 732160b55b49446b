"""Process nodes: a small kubelet (``lifeline node run``) that runs pods as local process groups."""

from lifeline.devcluster.node.agent import NodeAgent

__all__ = ["NodeAgent"]
