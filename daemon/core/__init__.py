"""The pure core: exposition text in, diagnoses and incident transitions out.

    parse ─► Snapshot ─► window ─► Signals ─► diagnose ─► Diagnosis ─► incidents ─► Transition
                                                                                      │
                                            alerts (payloads) ◄── report (text, JSON) ┘

``evaluate.Evaluator.step`` is the one entry point (``drive.Driver`` feeds it bodies).
Nothing here reads a clock, touches the network or keeps global state, and nothing here
imports anything outside this package except ``vllm_triage.errors``
(``tests/test_architecture.py`` checks it): every snapshot carries its own time, so a
recording replays exactly as it ran. ``docs/architecture.md`` draws the whole tree.
"""
