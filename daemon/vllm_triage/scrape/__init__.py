"""Scrape mode: one target's scrape loop (``loop``), which hands each snapshot to its
``Target``, and its active probe (``probe``)."""
