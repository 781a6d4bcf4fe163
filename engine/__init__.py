"""The real GPU decode loop: a Llama-family model, KV cache with block metadata, drafters, tree
verification through ``kernels``, lossless acceptance and per-round traces (issue #6).
"""
