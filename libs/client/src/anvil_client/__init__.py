"""anvil_client."""
