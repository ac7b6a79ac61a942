"""CPU kernels in C++ called through XLA's FFI, built on first use with the system compiler."""
