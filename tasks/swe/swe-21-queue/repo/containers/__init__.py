"""containers: see fifo.py."""
