"""Plain PyTorch references: float64-accumulated math, readable (imported as workbench.reference)."""
