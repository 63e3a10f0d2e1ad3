"""The head's kernels: build (compiling and loading pfc_kernels.cc) and ops (the HeadOps interface, its fused
and MXNet implementations)."""
