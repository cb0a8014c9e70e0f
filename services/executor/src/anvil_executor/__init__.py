"""anvil_executor."""
