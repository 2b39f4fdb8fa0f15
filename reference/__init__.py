"""Plain PyTorch references: fp32 math, readable (imported as workbench.reference)."""
