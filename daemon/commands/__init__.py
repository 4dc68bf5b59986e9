"""One module per ``vllm-triage`` subcommand, each with ``add_parser(sub)`` and ``run(args)``.

``daemon.cli`` only builds the parser from these and dispatches. Each command imports
what it needs inside ``run``, so ``vllm-triage --help`` starts without the daemon's
libraries.
"""
