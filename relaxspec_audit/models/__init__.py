"""Model tooling: building the embedded pair and fetching the real one.

``models.zoo`` trains the embedded target/draft pair under ``data/models/``;
``models.real`` fetches, verifies and caches the real Qwen2.5-Coder pair and the MT-Bench
questions. Import the submodule you need: this package imports neither (nor torch).
"""
