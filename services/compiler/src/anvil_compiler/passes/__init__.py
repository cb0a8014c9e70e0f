"""Graph passes: constant folding, pattern fusion, INT4 quantization, the memory plan."""
