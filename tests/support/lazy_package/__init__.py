"""A package that imports its part only when asked, as sympy and other lazy packages do: the
preload hint's test (tests/integration/sandbox/test_preload_hint.py) preloads the package and has
an episode import ``lazy_package.part``."""
