"""Tests of d2lattn.gpt (the GPT of chapter 12), d2lattn.ngram and d2lattn.text."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
import torch

from d2lattn.gpt import (GPT, GPTConfig, fill_in_losses, held_out_losses, lr_schedule,
                         mask_tokens, next_token_probs, top_k_filter, top_p_filter, train_lm)
from d2lattn.ngram import KneserNeyLM
from d2lattn.text import (CharTokenizer, distinct_poems, load_corpus, load_split,
                          random_windows)


def small(positions="rotary", **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, block_size=16, num_hiddens=16, num_heads=2, num_layers=2,
               ffn_num_hiddens=32, positions=positions)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).double().eval()


# --- the model --------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["rotary", "learned"])
def test_cache_logits_equal_recomputation(positions):
    model = small(positions)
    tokens = torch.randint(0, 11, (3, 12))
    full = model(tokens)  # (B, T, V)
    caches = model.new_caches()
    steps = [model(tokens[:, :5], kv_caches=caches)]  # a prompt of 5, then one at a time
    steps += [model(tokens[:, t:t + 1], kv_caches=caches) for t in range(5, 12)]
    assert torch.allclose(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)
    assert len(caches[0]) == 12


def test_causal_future_does_not_change_past():
    model = small()
    a = torch.randint(0, 11, (2, 10))
    b = a.clone()
    b[:, 6:] = (b[:, 6:] + 1) % 11
    assert torch.allclose(model(a)[:, :6], model(b)[:, :6], rtol=0, atol=1e-12)


def test_weight_tying_and_parameter_count():
    model = small()
    assert model.head.weight is model.embedding.weight
    untied = small(tie_weights=False)
    assert untied.num_parameters() == model.num_parameters() + 11 * 16


@pytest.mark.parametrize("kw", [dict(greedy=True), dict(temperature=0.7, top_k=3),
                                dict(top_p=0.9)])
def test_generate_with_and_without_cache_agree(kw):
    model = small()
    prompt = torch.randint(0, 11, (2, 4))
    with_cache = model.generate(prompt, 10, use_cache=True,
                                generator=torch.Generator().manual_seed(1), **kw)
    without = model.generate(prompt, 10, use_cache=False,
                             generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :4], prompt)


def test_generate_greedy_is_argmax_and_beyond_block_size():
    model = small()
    prompt = torch.randint(0, 11, (1, 3))
    out = model.generate(prompt, 20, greedy=True)  # 23 > block_size 16: recomputes, cropped
    assert out.shape == (1, 23)
    nxt = model(out[:, -16 - 1:-1])[:, -1].argmax(-1)
    assert int(nxt) == int(out[0, -1])


def test_generate_leaves_training_mode():
    model = small().train()
    model.generate(torch.zeros(1, 2, dtype=torch.long), 3, greedy=True)
    assert model.training


@pytest.mark.parametrize("kw, match", [
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=12), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(greedy=True, top_k=3), "greedy"),
    (dict(use_cache=True, max_new_tokens=20), "use_cache"),
])
def test_generate_bad_arguments(kw, match):
    model = small()
    args = dict(max_new_tokens=3)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        model.generate(torch.zeros(1, 2, dtype=torch.long), args.pop("max_new_tokens"), **args)


def test_forward_bad_arguments():
    model = small()
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.full((1, 3), 11))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="kv_caches"):
        model(torch.zeros(1, 2, dtype=torch.long), kv_caches=[])
    with pytest.raises(ValueError, match="prompt"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="positions"):
        GPTConfig(positions="sinusoidal")
    with pytest.raises(ValueError, match="num_heads"):
        GPTConfig(num_heads=0)


# --- the sampling filters ---------------------------------------------------------------------

def test_top_k_keeps_exactly_k():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 30, generator=g)
    logits[0, :5] = 1.0  # ties
    for k in (1, 4, 17, 30):
        kept = top_k_filter(logits, k).isfinite()
        assert (kept.sum(-1) == k).all()
        # the kept logits are the k largest
        assert (logits[kept].view(50, k).min(-1).values
                >= logits.masked_fill(kept, -1e9).max(-1).values).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 20, generator=g, dtype=torch.float64) * 2
    probs = logits.softmax(-1)
    for p in (0.1, 0.5, 0.9, 0.999, 1.0):
        kept = top_p_filter(logits, p).isfinite()
        mass = (probs * kept).sum(-1)
        assert (mass >= p - 1e-12).all()  # the kept set reaches p
        # removing its least likely member would fall below p: it is the smallest such set
        least = probs.masked_fill(~kept, 2.0).min(-1).values
        assert (mass - least < p).all()
        # and it is made of the most likely tokens
        assert (probs.masked_fill(~kept, 2.0).min(-1).values
                >= probs.masked_fill(kept, -1.0).max(-1).values).all()


def test_filters_do_not_write_into_the_input_and_check_arguments():
    logits = torch.randn(3, 5)
    before = logits.clone()
    top_k_filter(logits, 2), top_p_filter(logits, 0.5), next_token_probs(logits, top_k=2)
    assert torch.equal(logits, before)
    for fn, bad in ((top_k_filter, 0), (top_k_filter, 6), (top_k_filter, 2.0),
                    (top_p_filter, 0.0), (top_p_filter, 1.01), (top_p_filter, True)):
        with pytest.raises(ValueError):
            fn(logits, bad)
    with pytest.raises(ValueError, match="temperature"):
        next_token_probs(logits, temperature=-1.0)
    with pytest.raises(ValueError, match="logits"):
        top_k_filter(torch.ones(3, dtype=torch.long), 1)


def test_next_token_probs_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(next_token_probs(logits, temperature=0.5), (logits * 2).softmax(-1))
    assert next_token_probs(logits, temperature=1e-3).argmax() == 0
    assert torch.allclose(next_token_probs(logits, top_p=1.0), logits.softmax(-1))


# --- training and evaluation ------------------------------------------------------------------

# --- masked language modelling ---------------------------------------------------------------

def test_mask_tokens_follows_bert_rule_and_leaves_input_alone():
    tokens = torch.randint(0, 10, (64, 256), generator=torch.Generator().manual_seed(1))
    before = tokens.clone()
    inputs, targets = mask_tokens(tokens, 10, rate=0.15,
                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens, before)  # no write into the caller's tensor
    chosen = targets != -100
    assert torch.equal(targets[chosen], tokens[chosen])
    assert torch.equal(inputs[~chosen], tokens[~chosen])  # unchosen positions untouched
    n = int(chosen.sum())
    assert abs(n / tokens.numel() - 0.15) < 0.01
    masked = float((inputs[chosen] == 10).sum()) / n
    kept = float((inputs[chosen] == tokens[chosen]).sum()) / n
    assert abs(masked - 0.8) < 0.02
    assert abs(kept - (0.1 + 0.1 / 10)) < 0.02  # kept, or replaced by itself at random
    assert int(inputs.max()) == 10 and int(inputs.min()) >= 0


@pytest.mark.parametrize("kw, match", [(dict(mask_id=0), "mask_id"), (dict(rate=0.0), "rate"),
                                       (dict(rate=1.0), "rate"), (dict(mask_id=5), r"\[0, 5\)")])
def test_mask_tokens_bad_arguments(kw, match):
    args = dict(mask_id=10, rate=0.15)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        mask_tokens(torch.randint(0, 10, (2, 8)), args["mask_id"], rate=args["rate"])


def test_non_causal_model_sees_the_future_and_refuses_to_write():
    model = small(causal=False)
    a = torch.randint(0, 11, (2, 10))
    b = a.clone()
    b[:, 7:] = (b[:, 7:] + 1) % 11
    assert not torch.allclose(model(a)[:, :7], model(b)[:, :7])  # the past sees the future
    with pytest.raises(ValueError, match="causal"):
        model.generate(a[:, :2], 3)
    with pytest.raises(ValueError, match="causal"):
        model(a, kv_caches=model.new_caches())


def test_train_lm_masked_objective_and_its_checks():
    data = torch.arange(400) % 10
    mlm = small(vocab_size=11, causal=False).float()
    losses = train_lm(mlm, data, 200, batch_size=16, lr=1e-2, warmup=5, mask_id=10)
    # a periodic stream: a blank is given away by its neighbours (0.79 against 2.38 here)
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:5]) / 5
    with pytest.raises(ValueError, match="causal=False"):
        train_lm(small().float(), data, 2, mask_id=10)
    with pytest.raises(ValueError, match="mask_id"):
        train_lm(mlm, data, 2)
    with pytest.raises(ValueError, match="last token"):
        train_lm(mlm, data, 2, mask_id=3)


def test_fill_in_losses_same_blanks_for_both_models():
    data = torch.arange(16 * 8) % 10
    causal, masked = small(vocab_size=10).float(), small(causal=False).float()
    a = fill_in_losses(causal, data, seed=3)
    b = fill_in_losses(masked, data, mask_id=10, seed=3)
    assert a.shape == b.shape and a.numel() > 0  # the same blanks
    assert torch.isfinite(a).all() and (a > 0).all()
    assert torch.allclose(b.mean(), b.mean())  # finite
    with pytest.raises(ValueError, match="mask_id"):
        fill_in_losses(masked, data)
    with pytest.raises(ValueError, match="rate"):
        fill_in_losses(causal, data, rate=1.5)


def test_lr_schedule_warmup_and_decay():
    lrs = [lr_schedule(s, 100, 1.0, warmup=10, min_ratio=0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_train_lm_learns_a_periodic_stream_and_held_out_losses():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=1, ffn_num_hiddens=32))
    data = torch.arange(400) % 5
    losses = train_lm(model, data, 60, batch_size=8, lr=1e-2, warmup=5)
    assert len(losses) == 60 and losses[-1] < 0.2 * losses[0]
    bits = held_out_losses(model, data[:81])
    assert bits.shape == (10, 8) and bits.mean() < 0.5


# --- text and n-grams -------------------------------------------------------------------------

def test_splits_are_fixed_and_disjoint():
    s = load_split("shakespeare")
    assert len(s.text) == 1_115_394 and s.train + s.held_out == s.text
    assert len(s.held_out) == len(s.text) - int(0.9 * len(s.text))
    t = load_split("tang")
    poems = load_corpus("tang").splitlines()
    assert len(poems) == 18_492 and len(set(poems)) == 18_186  # 306 exact repeats in the file
    assert len(t.train_poems) + len(t.held_out_poems) == 17_348  # and 838 near-repeats
    assert t.held_out_poems[0] == poems[9]
    assert not set(t.held_out_poems) & set(t.train_poems)
    # no held-out poem shares half its half-lines with a training poem (counted independently)
    halves = lambda p: set(re.findall(r"[^，。？！；]+", p))
    seen = {}
    for i, p in enumerate(t.train_poems):
        for h in halves(p):
            seen.setdefault(h, []).append(i)
    for p in t.held_out_poems:
        mine = halves(p)
        shared = Counter(i for h in mine for i in seen.get(h, ()))
        assert all(2 * n < min(len(mine), len(halves(t.train_poems[i])))
                   for i, n in shared.items())


def test_distinct_poems_drops_repeats_and_near_repeats():
    a, b = "白日依山盡，黃河入海流。", "欲窮千里目，更上一層樓。"
    near = "白日依山盡，長河入海流。"  # shares one of its two half-lines with a
    assert distinct_poems([a, a, near, b]) == [a, b]
    assert distinct_poems([a, b]) == [a, b]
    eight = a + b + "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。"
    assert distinct_poems([eight, b]) == [eight]  # all of b's half-lines are in eight
    with pytest.raises(ValueError, match="name"):
        load_corpus("hamlet")


def test_tokenizer_round_trip_and_errors():
    tok = CharTokenizer("to be or not")
    assert tok.decode(tok.encode("not to be")) == "not to be"
    with pytest.raises(ValueError, match="vocabulary"):
        tok.encode("xyz")
    X, Y = random_windows(torch.arange(50), 4, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(Y, X + 1)
    with pytest.raises(ValueError, match="data"):
        random_windows(torch.arange(5), 2, 6)


def test_kneser_ney_is_a_distribution_and_beats_lower_orders():
    text = "the cat sat on the mat. the cat ate the rat. " * 20
    lm = KneserNeyLM(text, 4, vocab=text + "xyz")
    for history in ("", "t", "th", "the", "zzz", "at "):
        for order in (1, 2, 3, 4):
            total = sum(lm.prob(w, history, order=order) for w in lm.vocab)
            assert math.isclose(total, 1.0, rel_tol=1e-12)
    test = "the cat ate the mat. the cat sat on the rat."  # seen contexts: longer ones help
    mean = [sum(lm.bits(test, order=n)) / (len(test) - 1) for n in (1, 2, 3, 4)]
    assert mean[0] > mean[1] > mean[2] > mean[3]
    with pytest.raises(ValueError, match="order"):
        lm.prob("t", "", order=5)
    with pytest.raises(ValueError, match="vocabulary"):
        lm.bits("the dog", order=2)
    with pytest.raises(ValueError, match="max_order"):
        KneserNeyLM(text, 0)
