"""Data files shipped as ``vllm_triage.bundled_rules`` (read with ``vllm_triage.rules.read_bundled``).

This file holds no code. It exists because a namespace package's resources cannot be
read from a setuptools editable install on Python 3.11 (``importlib.resources`` raises
``NotADirectoryError`` on the editable finder's placeholder path), so without it the
bundled tables are missing in development checkouts.
"""
