"""The real GPU decode loop: a Llama-family model, KV cache with block metadata, drafters, tree
verification through ``kernels``, lossless acceptance and per-round traces.

One concept per module (nano-vllm's layout):

- ``config`` (``ModelConfig`` from/to HF config.json), ``rope``, ``model`` (``CausalLM``, the
  decoder; attention through a callback), ``checkpoint`` (HF safetensors load/save, random
  weights for registry geometries, ``--model`` sources);
- ``cache`` (``KVCache`` ``[L, 2, B, Hkv, T_max, D]``, commit/rollback, block metadata and NSA
  compressed tokens), ``tree`` (``DraftTree``: the root plus the draft tree, flattened),
  ``attention`` (dense / sparse / NSA with refresh-reuse), ``runner`` (``ModelRunner``: prefill,
  tree forward, commit), ``graphs`` (CUDA graphs);
- ``drafter`` (interface, level-wise expansion), ``draft_model`` (a small draft model;
  self-speculation with sparse attention), ``ngram`` (prompt lookup), ``acceptance`` (greedy and
  multi-draft rejection sampling);
- ``loop`` (``Engine.generate``), ``settings`` (``DecodeConfig``, ``TrainConfig``), ``stats``
  (selection overlaps, PRR hit rates), ``timing``, ``trace_writer``, ``controller`` (the online
  hook the planner's controller implements);
- ``corpus`` and ``train`` (``ssvkit train-tiny``).

Importing this package does not import torch; ``config``, ``settings`` and ``controller`` do
not either.
"""
