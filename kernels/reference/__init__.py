"""NumPy float64 references of every kernel: the definition each kernel is tested against."""
