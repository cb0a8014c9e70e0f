"""anvil_gateway."""
