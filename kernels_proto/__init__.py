"""Prototype CUDA kernels under development (not imported by the package). Each prototype is
moved into its op-family module in ``numba_kernels/`` once it is checked and timed on a GPU."""
