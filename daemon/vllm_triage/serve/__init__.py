"""The daemon's HTTP endpoint: the listener (``listener``), its routes (``routes``), the
derived metrics (``exporter``), the JSON API (``api``) and the status page's document
(``status``). Reads what the targets published (``vllm_triage.state``), nothing else."""
