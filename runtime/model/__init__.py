"""What is trained, the same for every plan kind: `llama` (parameter catalogue, deterministic
init, the decoder's math, the one-process model), `tp` (Megatron tensor-parallel autograd
functions over the communicator), `data` (synthetic stream, byte-level corpus in `data/`, one
loader), `reference` (one-process training: the equivalence baseline). Modules are imported
by their full name; this package imports nothing.
"""
