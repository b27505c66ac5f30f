"""Small programs the tests run as separate processes (so they can be killed for real)."""
