"""Telling people: transitions to notifications (``notifier``), each receiver's encoding
(``receivers``) and its ordered, retried delivery queue (``delivery``)."""
