"""Side-by-side benchmarks of mgfl's kernels and training steps against reference libraries on
the same hardware, measured in one process on the same inputs (``mgfl bench``)."""
