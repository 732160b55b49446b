"""lifeline.launch (see DESIGN.md)."""
