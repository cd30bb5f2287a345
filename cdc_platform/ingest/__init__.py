"""Transports: bring messages into the raw layer exactly as received."""
