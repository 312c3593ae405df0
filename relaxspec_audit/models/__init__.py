"""Model tooling: fetching the real pair.

``models.real`` fetches, verifies and caches the real Qwen2.5-Coder pair and the MT-Bench
questions. Import the submodule you need: this package imports neither it nor torch.
"""
