"""The real GPU decode loop: a Llama-family model, KV cache with block metadata, drafters, tree
verification through ``kernels``, lossless acceptance and per-round traces.

One concept per module (nano-vllm's layout): the model (``config``, ``rope``, ``model``,
``checkpoint``), the verify step (``cache``, ``tree``, ``attention``, ``runner``, ``graphs``),
the drafters (``drafter``, ``draft_model``, ``ngram``, ``oracle``) and ``acceptance``, the loop
(``loop``'s ``Engine.generate``, ``settings``, ``stats``, ``trace_writer``, and ``controller``:
the online hook the planner's controller implements), and ``corpus`` and ``train``
(``ssvkit train-tiny``).

Importing this package does not import torch; ``config``, ``settings`` and ``controller`` do
not either.
"""
