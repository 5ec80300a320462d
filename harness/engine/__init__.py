"""The engine layer: a model's weights resident on one backend, per-session caches, the forward
pass. Knows nothing of schedules, walkers or receipts.

Read in this order: :mod:`.config` (the HF config as a dataclass), :mod:`.weights` (safetensors
checkpoints), :mod:`.layout` (HF tensors → the fused engine buffers), :mod:`.backend` (cpu | cuda:
the op set and array helpers), :mod:`.cache` (per-session state: Cache, Snapshot, Session),
:mod:`.graphs` (captured steps), :mod:`.model` (the Engine: forward pass and MTP head).
:mod:`.digests` holds every digest primewalk records and :mod:`.rope` the RoPE tables.
"""
