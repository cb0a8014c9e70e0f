"""anvil_core."""
