"""The embedded model pair under data/models/arith (docs/ARCHITECTURE.md "The embedded pair").

Loads both models offline exactly as a user's models are loaded, checks the tokenizer
contract the decoder relies on, and re-measures the model card's numbers on a small
sample: greedy correctness per item (deterministic) and the `exact`-rule acceptance
α = Σ_x min(p, q) (THEORY §2.1) on the card's check sample.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import zoo
import zoo_data
import zoo_measure

from relaxspec_audit import tasks

PAIR = Path(__file__).resolve().parents[2] / "data" / "models" / "arith"
# Targets of issue 15 the committed pair does not meet (pair_check.md shows the value,
# README "What make demo shows" why); a regression elsewhere fails the pair-check test.
KNOWN_MISSES: set[str] = set()


@pytest.fixture(scope="module")
def metrics():
    return json.loads((PAIR / "metrics.json").read_text())


@pytest.fixture(scope="module")
def pair(metrics):
    import torch

    # The card was measured with this many threads; the same count gives the same
    # float summation order, so greedy outputs and samples reproduce exactly.
    torch.set_num_threads(metrics["config"]["threads"])
    return zoo_measure.load_pair(PAIR)


def test_pair_is_committed_small_and_loads_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for role in ("target", "draft"):
        folder = PAIR / role
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        assert model.config.model_type == "llama"
        assert model.config.eos_token_id == tok.eos_token_id
        assert model.generation_config.eos_token_id == tok.eos_token_id
        assert model.generation_config.pad_token_id == tok.pad_token_id
        assert model.get_input_embeddings().weight.shape[0] == len(tok)
        out = model(torch.tensor([tok("Q: 1+2=?\nA:")["input_ids"]])).logits
        assert out.shape[-1] == len(tok) and torch.isfinite(out).all()
    total = sum(f.stat().st_size for f in PAIR.rglob("*") if f.is_file())
    assert total < 15e6
    assert (PAIR / "MODEL_CARD.md").is_file()


def test_vocabularies_identical(pair):
    target, draft, _ = pair
    a = (PAIR / "target" / "tokenizer.json").read_bytes()
    b = (PAIR / "draft" / "tokenizer.json").read_bytes()
    assert a == b
    assert target.config.vocab_size == draft.config.vocab_size
    # The draft really is the smaller model.
    assert zoo.count_params(draft) * 3 < zoo.count_params(target)


def test_tokenizer_round_trips_task_text_and_adds_no_special_tokens(pair):
    _, _, tok = pair
    specials = {tok.eos_token_id, tok.bos_token_id, tok.pad_token_id}
    texts = []
    for name in tasks.BUNDLED:
        for item in tasks.load_task(name).items:
            texts.append(item.prompt)
            texts.append(item.prompt + " " + (item.metadata.get("solution") or ""))
    texts += ["def f(x):\n    return x ** 2  # ünïcode ✓\n", "#### -1,234.5"]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert not specials & set(ids)
        assert tok.decode(ids) == text
    # Digits are single tokens, so numbers are spelled the same in prompt and answer.
    assert len(tok("1234567890")["input_ids"]) == 10
    # Encoding prompt and completion separately equals encoding them together (the
    # boundary the models were trained on and the decoder sees).
    item = tasks.load_task("arith").items[0]
    solution = " " + item.metadata["solution"]
    assert tok(item.prompt + solution)["input_ids"] == (
        tok(item.prompt)["input_ids"] + tok(solution)["input_ids"]
    )


def test_models_stop_with_eos_after_the_answer(pair):
    import torch

    target, _, tok = pair
    item = tasks.load_task("arith").items[0]
    ids = torch.tensor([tok(item.prompt)["input_ids"]])
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False
    )
    assert out[0, -1].item() == tok.eos_token_id
    assert out.shape[1] - ids.shape[1] < 40
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "####" in text


def test_recorded_numbers_meet_the_realism_targets(metrics):
    # Issue 15's ranges: a target a deployment would use, a draft worse but not useless.
    arith = metrics["accuracy"]["arith"]
    assert arith["n"] == 2 * tasks.BUNDLED_PER_SPLIT
    assert 0.70 <= arith["target"] <= 0.97
    assert 0.10 <= arith["draft"] <= 0.60 and arith["draft"] < arith["target"] - 0.2
    assert len(arith["target_correct"]) == round(arith["target"] * arith["n"])
    t1 = metrics["accuracy_t1"]["arith"]
    assert t1["n"] == arith["n"] and t1["draft"] < t1["target"]
    alpha = metrics["acceptance"]["arith"]["alpha"]
    assert 0.5 <= alpha <= 0.9
    assert metrics["acceptance"]["all"]["positions"] > 5000
    assert sum(metrics["weights_bytes"].values()) <= 30e6
    assert metrics["train_total_s"] <= 40 * 60
    card = (PAIR / "MODEL_CARD.md").read_text()
    assert f"{100 * arith['target']:.1f}%" in card and f"{alpha:.3f}" in card


def test_both_corpora_pose_the_same_problems_in_their_own_phrasing():
    cfg = replace(zoo.ZooConfig(), n_arith=4000, n_sort=10, n_story=10)
    target = zoo_data.training_examples(cfg, "target")["arith"]
    draft = zoo_data.training_examples(cfg, "draft")["arith"]
    assert [p for p, _ in target] == [p for p, _ in draft]
    assert sum(a != b for (_, a), (_, b) in zip(target, draft, strict=True)) > 1000
    # Every phrasing is a correct solution: the scorer reads the same answer from both.
    item = tasks.load_task("arith").items[0]
    for (prompt, a), (_, b) in zip(target[:500], draft[:500], strict=True):
        want = tasks.extract_answer(a)
        assert want is not None and tasks.extract_answer(b) == want
        terms = re.findall(r"[+-]?\d+", prompt.split("=")[0])
        assert sum(int(t) for t in terms) == want
    assert tasks.extract_answer(" " + item.metadata["solution"]) == float(item.reference)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_corpus_phrasing_matches_its_style(role):
    # Opener frequencies of 4,000 generated solutions against the style's weights: a
    # multinomial share's SE is at most sqrt(0.25 / 4000) = 0.0079, so 0.04 is > 5 SE.
    cfg = replace(zoo.ZooConfig(), n_arith=4000, n_sort=10, n_story=10)
    style = {"target": tasks.TARGET_STYLE, "draft": tasks.DRAFT_STYLE}[role]
    completions = [c for _, c in zoo_data.training_examples(cfg, role)["arith"]]
    for opener, weight in zip(tasks.OPENERS[1:], style.openers[1:], strict=True):
        share = sum(c.startswith(" " + opener) for c in completions) / len(completions)
        assert share == pytest.approx(weight, abs=0.04), opener


def test_style_weights_are_checked():
    with pytest.raises(ValueError, match=r"ArithStyle\.openers"):
        tasks.ArithStyle((0.5, 0.5), 0.5, tasks.TARGET_STYLE.connectors, (0.5, 0.5))
    with pytest.raises(ValueError, match="keep_order"):
        tasks.ArithStyle(tasks.TARGET_STYLE.openers, 1.5, tasks.TARGET_STYLE.connectors,
                         tasks.TARGET_STYLE.answers)  # fmt: skip
    with pytest.raises(ValueError, match=r"ArithStyle\.answers"):
        tasks.ArithStyle(
            tasks.TARGET_STYLE.openers, 0.5, tasks.TARGET_STYLE.connectors, (0.5, 0.5)
        )  # a weight per answer word: three, not two


def test_target_is_uncertain_where_the_phrasing_is_free(pair):
    # The first completion token chooses the opener: the trained target spreads its mass
    # over the openers roughly as its corpus does (entropy well above 0.5 nats), while
    # at a digit of the answer it is nearly certain. Held-out prompts, greedy-free.
    import torch

    target, _, tok = pair
    items = tasks.load_task("arith", limit=40).items
    first = [tok(" " + o.rstrip())["input_ids"][0] for o in tasks.OPENERS[1:]]
    mass, entropy = torch.zeros(len(first)), []
    with torch.no_grad():
        for item in items:
            ids = torch.tensor([tok(item.prompt)["input_ids"]])
            p = torch.softmax(target(ids).logits[0, -1].float(), -1)
            mass += p[first] / len(items)
            entropy.append(-(p * p.clamp_min(1e-12).log()).sum().item())
    for m, w in zip(mass.tolist(), tasks.TARGET_STYLE.openers[1:], strict=True):
        assert m == pytest.approx(w, abs=0.1)
    assert sum(entropy) / len(entropy) > 0.5


@pytest.mark.parametrize("task_name", ["arith", "sort"])
def test_greedy_accuracy_reproduces_the_card_item_by_item(pair, metrics, task_name):
    target, draft, tok = pair
    task = tasks.load_task(task_name, limit=zoo_measure.CHECK_ITEMS if task_name == "arith" else 15)
    ids = {item.id for item in task.items}
    for role, model in (("target", target), ("draft", draft)):
        scores = zoo_measure.item_scores(model, tok, task)
        got = {k for k, v in scores.items() if v}
        want = set(metrics["accuracy"][task_name][f"{role}_correct"]) & ids
        # Greedy decoding is deterministic; allow one flip from float summation order
        # on other hardware or thread counts.
        assert len(got ^ want) <= 1, (role, sorted(got ^ want))


def test_acceptance_reproduces_the_card_on_the_check_sample(pair, metrics):
    target, draft, tok = pair
    seed = metrics["config"]["seed"]
    for name in ("arith", "story"):
        prompts = [i.prompt for i in tasks.load_task(name, limit=zoo_measure.CHECK_PROMPTS).items]
        got = zoo_measure.acceptance_rate(target, draft, tok, prompts, seed)
        want = metrics["check"][f"alpha_{name}"]
        assert got["positions"] >= 0.9 * want["positions"]
        assert got["alpha"] == pytest.approx(want["alpha"], abs=0.03)
        # The small sample estimates the task-level number (sampling noise only).
        assert got["alpha"] == pytest.approx(metrics["acceptance"][name]["alpha"], abs=0.1)


def test_training_data_excludes_the_bundled_items_and_is_deterministic():
    cfg = replace(zoo.ZooConfig(), n_arith=3000, n_sort=1000, n_story=200)
    data = zoo_data.training_examples(cfg)
    held_out = tasks.held_out_prompts()
    for name in ("arith", "sort"):
        assert not {p for p, _ in data[name]} & held_out
    assert zoo_data.training_examples(cfg) == data
    assert zoo_data.training_examples(replace(cfg, seed=1)) != data


def test_training_is_deterministic_in_the_seed(pair):
    import torch

    _, _, tok = pair
    cfg = zoo.ZooConfig()
    spec = zoo.ModelSpec(32, 1, 2, 64, steps=3, lr=1e-3)
    examples = zoo_data.training_examples(replace(cfg, n_arith=64, n_sort=16, n_story=16))
    data = {n: zoo_data.encode_examples(tok, ex, n == "story") for n, ex in examples.items()}
    weights = []
    for _ in range(2):
        model = zoo.make_model(spec, tok, seed=7)
        info = zoo.train_model(model, data, spec, cfg, seed=7)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert info["steps"] == 3 and info["final_loss"] > 0
    assert torch.equal(weights[0], weights[1])


def test_committed_pair_check_is_of_this_pair_and_meets_its_targets():
    # data/models/arith/pair_check.json is `make pair-check` on a demo batch of the
    # committed weights (MODEL_CARD.md); a retrained pair without a new check fails here.
    import pair_check

    check = json.loads((PAIR / "pair_check.json").read_text())
    assert check["inputs"]["weights_sha256"] == pair_check.weights_sha256(PAIR)
    assert {t["target"] for t in check["targets"]} == set(pair_check.TARGETS)
    missed = [t["target"] for t in check["targets"] if not t["met"]]
    assert set(missed) <= KNOWN_MISSES, missed
    assert check["n_met"] == len(check["targets"]) - len(missed)


def test_training_one_role_refuses_a_kept_model_built_differently(tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "arith"
    shutil.copytree(PAIR, out)
    tok = AutoTokenizer.from_pretrained(out / "target")
    cfg = zoo.ZooConfig()
    zoo._check_kept(out, cfg, tok, ("draft",))  # the committed pair: consistent
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["config"]["target"]["steps"] += 1
    (out / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(ValueError, match=r"config\.target is .* rebuild both"):
        zoo._check_kept(out, cfg, tok, ("draft",))
    with pytest.raises(FileNotFoundError, match="needs a built pair"):
        zoo._check_kept(tmp_path / "none", cfg, tok, ("draft",))
