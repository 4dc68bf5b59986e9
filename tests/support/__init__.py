"""Shared helpers of the test suite, imported as ``support.<module>`` (pyproject.toml puts
``tests/`` on the path). Fixtures stay in ``tests/conftest.py``; everything else the test
modules share lives here."""
