"""Optimized kernels, one folder per op (imported as workbench.kernels)."""
