"""The train kit: what every train backend composes, written once in the core.

Train backends (``src/rlzoo/backends/native``, ``src/rlzoo/backends/fsdp2``, ``src/rlzoo/backends/megatron``) are peers that never
import each other; what they share lives here, one module per job:

- :mod:`rlzoo.train_kit.params`: the params fields every trainer of Hugging Face models shares
  (import-light: no torch);
- :mod:`rlzoo.train_kit.models`: loading the actor, the critic's backbone and value head;
- :mod:`rlzoo.train_kit.logprobs`: chunked log-probs / entropy, padding-free packing, one
  micro-batch's response log-probs, ``sum_pi_squared`` and values;
- :mod:`rlzoo.train_kit.update`: the LR schedule, the micro-batch update loop, the optimizer step
  that skips non-finite updates;
- :mod:`rlzoo.train_kit.modes`: a module in eval mode around a forward that must not train;
- :mod:`rlzoo.train_kit.checkpoint`: safetensors + JSON checkpoints written atomically, their
  ``meta.json``, LoRA adapters and HF exports.

Each backend keeps its own collectives and parallelism around them.
"""
