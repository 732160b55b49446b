"""lifeline.runtime (see DESIGN.md)."""
