"""lifeline.control (see DESIGN.md)."""
