"""lifeline.operator (see DESIGN.md)."""
