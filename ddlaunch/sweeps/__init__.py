"""Sweeps on the login node: the sweep file (spec), members' validation and arrays (prepare),
members.json (packing), submission and resubmission, sweep status."""
