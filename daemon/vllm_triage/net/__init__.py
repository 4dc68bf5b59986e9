"""Talking to peers: the bounded HTTP reading path (``fetch``) and what of a URL or an
error may be shown (``redact``)."""
