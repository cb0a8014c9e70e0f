"""anvil_scheduler."""
