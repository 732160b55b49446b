"""lifeline.api (see DESIGN.md)."""
