"""Test support: the one fake runner, run-directory builders, the dev-cluster handle."""
