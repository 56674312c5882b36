"""A program whose module fails to import."""

import nowhere_to_be_found  # noqa: F401
