"""The pure core: exposition text in, diagnoses and incident transitions out.

    parse ─► Snapshot ─► totals ─► WindowTotals ─► signals ─► Signals ─► diagnose ─► Diagnosis
                                                                                         │
                  alerts (payloads) ◄── report (text, JSON) ◄── Transition ◄── incidents ┘

``diagnose`` puts its parts in causal order: ``stall`` (judged first), ``facts`` (the
derived numbers and the evidence), ``checks``, ``decode`` (the decode split) and
``prose`` (the words). ``evaluate.Evaluator.step`` is the one entry point (``drive.Driver``
feeds it bodies); its ``Evaluation`` carries each model's signals, diagnosis and
measurements. Nothing here reads a clock, touches the network or keeps global state, and
nothing here imports anything outside this package except ``vllm_triage.errors``
(``tests/test_architecture.py`` checks it): every snapshot carries its own time, so a
recording replays exactly as it ran. ``docs/architecture.md`` draws the whole tree.
"""
