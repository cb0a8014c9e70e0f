// ${KERNEL}: out = act(x) elementwise, act code ${ACT} (see anvil_act). CPU twin: the same
// activation in anvil_kernels.activations (relu / gelu / silu) or numpy (sigmoid / tanh).
extern "C" __global__ void ${KERNEL}(const float* __restrict__ x, float* __restrict__ out, int n) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = anvil_act(x[i], ${ACT});
}
