"""The Partial FC head: what one training step of the classifier does (docs/DESIGN.md 1-4).

partial_fc (the step and its three collectives), sampler (which centers a step
uses, and the sizing arithmetic, without MXNet), exchange (the wire format of the
collectives), memory_bank (the per-rank centers and their SGD), margin (the
margin losses), set_heads (one head per training set over one batch, their
losses weighted), center_search (another set's most similar classes, blockwise over
the ranks), memory_model (what a head holds in memory), kernels (build:
compiling and loading the fused C++ operators; ops: the HeadOps interface, the
fused operators and their MXNet fallback).
It imports nothing from training, data or the supervisor; of the runtime only
comm, errors, seeding, files and vectors.
"""
