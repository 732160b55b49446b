"""lifeline.sidecar (see DESIGN.md)."""
