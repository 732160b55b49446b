"""lifeline.models (see DESIGN.md)."""
