"""The decode step roofline, a room of its own: the floor of one engine step (``step``),
the tokens a step computes (``batch``), where each fact comes from and what the metrics
add (``sources``), and KV bytes per token from vLLM's pool (``kvpool``). Arithmetic over
the core's shapes (``core/model.py``, ``core/rulebook.py``) and nothing else."""
