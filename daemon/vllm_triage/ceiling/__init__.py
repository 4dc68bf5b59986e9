"""The hardware side: the GPU table, a model's bytes and FLOPs, and the decode ceiling.

``gpus`` reads ``rules/gpus.yaml``; ``sizing`` turns a parameter count or a model's
``config.json`` into bytes read per token and KV bytes per token; ``hardware`` is the
single-stream ceiling arithmetic; ``resolve`` turns settings into the core's ``Ceiling``.
The arithmetic is explained in ``docs/physics.md``.
"""
