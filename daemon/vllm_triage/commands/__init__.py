"""One module per ``vllm-triage`` subcommand, each with ``add_parser(sub)`` and ``run(args)``.

``vllm_triage.cli`` only builds the parser from these and dispatches. Each command imports
what it needs inside ``run``, so ``vllm-triage --help`` starts without the daemon's
libraries.
"""
