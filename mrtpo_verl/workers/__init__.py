"""Replay workers: a verl single-controller ``Worker`` and the placements that run it."""
