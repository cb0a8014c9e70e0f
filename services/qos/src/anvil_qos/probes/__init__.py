"""eBPF probes (bcc): run-queue delay and CPU time, TCP on the gateway port, CUDA calls via uprobes."""
