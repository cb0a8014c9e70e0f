"""anvil_qos."""
