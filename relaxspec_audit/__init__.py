"""relaxspec_audit: audit relaxed verification in speculative decoding."""

__version__ = "0.1.0"
