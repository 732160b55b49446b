"""lifeline.bench (see DESIGN.md)."""
