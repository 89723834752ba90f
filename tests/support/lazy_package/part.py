"""The part ``lazy_package`` does not import itself."""

VALUE = 1.0
