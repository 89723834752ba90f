"""AReaL's experimental import paths, kept as thin re-exports of the single implementation."""
