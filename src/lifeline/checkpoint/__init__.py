"""lifeline.checkpoint (see DESIGN.md)."""
