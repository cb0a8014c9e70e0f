// ${KERNEL}: out = act(x) elementwise, act code ${ACT} (see anvil_act). CPU twin: the same
// activation in anvil_kernels.activations (relu / gelu / silu) or numpy (sigmoid / tanh).
extern "C" __global__ void ${KERNEL}(const ${ACT_T}* __restrict__ x, ${ACT_T}* __restrict__ out, int n) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) anvil_st(out, i, anvil_act(anvil_ld(x, i), ${ACT}));
}
