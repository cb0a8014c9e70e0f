"""anvil_qos: eBPF (or /proc) pressure probes turned into per-tenant throttles that protect p1's SLO."""
