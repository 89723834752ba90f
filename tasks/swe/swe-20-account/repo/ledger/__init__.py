"""ledger: see account.py."""
