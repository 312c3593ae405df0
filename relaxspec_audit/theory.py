"""Exact single-position maths of the verification rules: the public entry point.

Re-exports :mod:`relaxspec_audit.verify.theory` (THEORY §1–§2) under the documented path.
"""

from relaxspec_audit.verify.theory import *  # noqa: F403
from relaxspec_audit.verify.theory import __all__, _mass_above, _rank  # noqa: F401
