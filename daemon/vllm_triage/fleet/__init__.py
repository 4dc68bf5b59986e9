"""Fleet mode: every vLLM server a Prometheus query API knows, read per tick (``source``),
through queries (``queries``) whose answers become each server's window totals
(``signals``), with each server's card and model resolved (``hardware``)."""
