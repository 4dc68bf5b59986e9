"""Recordings: the file format (``files``), ``record`` (``record``), running the core over
one (``replay``), and the post-mortem report made from one (``report``, ``reportfile``)."""
