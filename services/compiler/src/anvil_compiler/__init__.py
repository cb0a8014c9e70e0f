"""anvil_compiler."""
