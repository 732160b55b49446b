"""lifeline.devcluster (see DESIGN.md)."""
