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
    (dict(temperature=-0.5), "temperature"),
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
    losses = train_lm(mlm, data, steps=200, batch_size=16, lr=1e-2, warmup=5, mask_id=10)
    # a periodic stream: a blank is given away by its neighbours (0.79 against 2.38 here)
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:5]) / 5
    with pytest.raises(ValueError, match="causal=False"):
        train_lm(small().float(), data, steps=2, mask_id=10)
    with pytest.raises(ValueError, match="mask_id"):
        train_lm(mlm, data, steps=2)
    with pytest.raises(ValueError, match="last token"):
        train_lm(mlm, data, steps=2, mask_id=3)


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
    losses = train_lm(model, data, steps=60, batch_size=8, lr=1e-2, warmup=5)
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


# --- numbers a server would trust (issue 40) ---------------------------------------------------

def test_top_p_one_keeps_every_token_of_a_gpt2_sized_vocabulary():
    """A float32 cumulative sum over 50,257 probabilities reaches 1 before the last tokens;
    p = 1 must keep them all."""
    g = torch.Generator().manual_seed(0)
    for spread in (1.0, 4.0):
        logits = torch.randn(2, 50_257, generator=g) * spread
        kept = top_p_filter(logits, 1.0)
        assert torch.equal(kept, logits)
        assert kept.data_ptr() != logits.data_ptr()  # a new tensor


@pytest.mark.parametrize("p, kept", [(0.5, 1), (0.75, 2), (0.7500001, 3), (0.74, 2)])
def test_top_p_boundary_with_exact_probabilities(p, kept):
    """[1/2, 1/4, 1/4]: after two tokens the mass is exactly 0.75, so p = 0.75 keeps two
    (``mass before < p``: a ``<=`` would keep the third)."""
    for dtype in (torch.float32, torch.float64):
        logits = torch.tensor([0.5, 0.25, 0.25], dtype=dtype).log()
        assert torch.isfinite(top_p_filter(logits, p)).sum().item() == kept
        probs = next_token_probs(logits, top_p=p)
        assert int((probs > 0).sum()) == kept


def test_top_p_sum_is_exact_where_float32_drifts():
    """Over a GPT-2-sized vocabulary with spread logits, a float32 running sum of the sorted
    probabilities drifts from their exact sum by more than the smallest of them, so it keeps
    the wrong number of tokens for p near 1; the filter sums in float64."""
    logits = torch.randn(50_257, generator=torch.Generator().manual_seed(0)) * 4
    sorted_probs = logits.softmax(-1).sort(descending=True).values  # float32, as the filter
    exact = sorted_probs.double()
    for p in (0.99999, 0.999999):
        expected = int(((exact.cumsum(-1) - exact) < p).sum())
        drifting = int(((sorted_probs.cumsum(-1) - sorted_probs) < p).sum())
        assert drifting < expected  # a case where the float32 sum is wrong
        assert int(torch.isfinite(top_p_filter(logits, p)).sum()) == expected


def _modes(model):
    return [m.training for m in model.modules()]


@pytest.mark.parametrize("fn", ["held_out", "fill_in", "generate"])
def test_evaluation_helpers_restore_the_mode_they_found(fn):
    model = small(dropout=0.1).train()
    model.blocks[0].eval()  # a frozen part stays frozen
    before = _modes(model)
    data = torch.randint(0, 11, (200,), generator=torch.Generator().manual_seed(0))
    if fn == "held_out":
        held_out_losses(model, data, max_windows=2)
    elif fn == "fill_in":
        fill_in_losses(model, data, max_windows=2)
    else:
        model.generate(data[None, :3], 2, greedy=True)
    assert _modes(model) == before


def test_evaluation_helpers_run_eval_mode_inside():
    """The losses are those of the eval-mode model (dropout off), whatever mode it was in."""
    model = small(dropout=0.5)
    data = torch.randint(0, 11, (200,), generator=torch.Generator().manual_seed(0))
    ref = held_out_losses(model.eval(), data, max_windows=3)
    torch.testing.assert_close(held_out_losses(model.train(), data, max_windows=3), ref)
    ref = fill_in_losses(model.eval(), data, max_windows=3)
    torch.testing.assert_close(fill_in_losses(model.train(), data, max_windows=3), ref)
    assert model.training


def _value_reads(fn):
    """Calls that read a tensor's value back to Python (a host synchronisation on an
    accelerator) while ``fn`` runs, by the file that made them."""
    import collections
    import traceback
    reads = collections.Counter()
    names = ["item", "tolist", "__bool__", "__int__", "__float__", "__index__"]
    originals = {n: getattr(torch.Tensor, n) for n in names}

    def counting(name):
        def read(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]  # the frame that read
            reads[caller.filename.replace("\\", "/").rsplit("/", 1)[-1]] += 1
            return originals[name](self, *args, **kwargs)
        return read

    try:
        for n in names:
            setattr(torch.Tensor, n, counting(n))
        fn()
    finally:
        for n in names:
            setattr(torch.Tensor, n, originals[n])
    return reads


@pytest.mark.parametrize("attention", ["softmax", "delta"])
@pytest.mark.parametrize("kw", [dict(greedy=True), dict(top_p=0.9, top_k=5),
                                dict(greedy=True, use_cache=False)])
def test_generate_reads_no_value_inside_its_loop(attention, kw):
    """The prompt's ids are checked once; inside the loop no check reads a value (the ids
    are the model's own, the delta rule's gates come from a sigmoid). The one read left on
    the CPU is masked_softmax's look for an empty row, which it skips on an accelerator."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, num_hiddens=16, num_heads=2,
                          num_layers=2, ffn_num_hiddens=32, attention=attention,
                          positions="rotary" if attention == "softmax" else "learned"))
    prompt = torch.zeros(1, 3, dtype=torch.long)
    short = _value_reads(lambda: model.generate(prompt, 1, **kw))
    long = _value_reads(lambda: model.generate(prompt, 8, **kw))
    del short["masking.py"], long["masking.py"]  # pragma: the CPU-only look (see above)
    assert long == short and sum(long.values()) == 1, long  # the prompt's range check
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.full((1, 3), 11))  # outside generate, forward still checks the values
    with pytest.raises(ValueError, match="vocab_size"):
        model.generate(torch.full((1, 3), 11), 2)


def _unigram_level(lm):
    """P(a) and P(c) after a history the bigram level never saw: the lower order alone."""
    return lm.prob("a", "q", order=2), lm.prob("c", "q", order=2)


def test_kneser_ney_uses_continuation_counts_not_raw_counts(monkeypatch):
    """Kneser–Ney's lower order counts the distinct characters a character follows, not how
    often it occurs. "a" occurs 10 times but only ever after "b"; "c" occurs 3 times, after
    3 different characters: Kneser–Ney ranks "c" above "a" (continuation counts 3 and 1),
    plain absolute discounting (raw counts 3 and 10 at every order) the other way round."""
    text = "ba" * 10 + "xc" + "yc" + "zc"
    p_a, p_c = _unigram_level(KneserNeyLM(text, 2, vocab=text + "q"))
    assert p_c > 2 * p_a
    # the same model with raw counts at every order (absolute discounting) fails the check
    monkeypatch.setattr(KneserNeyLM, "_level", lambda self, kind, k: _raw_level(self, k))
    p_a, p_c = _unigram_level(KneserNeyLM(text, 2, vocab=text + "q"))
    assert not p_c > 2 * p_a


def _raw_level(lm, k):
    from d2lattn.ngram import _context_stats
    return lm.raw[k], _context_stats(lm.raw[k])


# --- any device, any float (issue 40) -----------------------------------------------------------

@pytest.mark.parametrize("attention", ["softmax", "linear", "delta", "gated_delta"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpt_runs_in_half_precision_on_the_cpu(dtype, attention):
    """Chapter 12's GPT and chapter 14's recurrent cores (the delta rule's triangular solve
    has no half-precision kernel: it runs in float32 inside) in bfloat16 and float16."""
    model = small(attention=attention,
                  positions="rotary" if attention == "softmax" else "learned").float()
    tokens = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(tokens)
        out = model.to(dtype)(tokens)
    assert out.dtype == dtype
    tol = 0.05 if attention == "softmax" else 0.1
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    sample = model.generate(tokens[:, :3], 5, top_p=0.9, top_k=5,
                            generator=torch.Generator().manual_seed(0))
    assert sample.shape == (2, 8) and int(sample.max()) < 11
    assert top_p_filter(out, 1.0).dtype == dtype and top_p_filter(out, 0.5).dtype == dtype


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpt_helpers_run_on_cuda():
    """The model, its sampling, its losses and BERT's corruption on the input's device (run
    where a GPU is present; skipped otherwise)."""
    model = small().cuda()
    data = torch.randint(0, 11, (300,), generator=torch.Generator().manual_seed(0))
    ref = held_out_losses(small(), data, max_windows=4)
    torch.testing.assert_close(held_out_losses(model, data, max_windows=4), ref)
    ref = fill_in_losses(small(), data, max_windows=4)
    torch.testing.assert_close(fill_in_losses(model, data, max_windows=4), ref)
    prompt = data[None, :3].cuda()
    greedy = model.generate(prompt, 6, greedy=True)
    assert greedy.device.type == "cuda"
    assert torch.equal(greedy.cpu(), small().generate(prompt.cpu(), 6, greedy=True))
    sample = model.generate(prompt, 6, top_p=0.9,
                            generator=torch.Generator("cuda").manual_seed(0))
    assert sample.device.type == "cuda"
    import warnings

    def syncs(n):  # host synchronisations while generating n tokens
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model.generate(prompt, n, greedy=True)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return len(caught)

    assert syncs(8) == syncs(1)  # none inside the loop
    inputs, targets = mask_tokens(data.view(3, 100).cuda(), 10,
                                  generator=torch.Generator().manual_seed(0))
    ref_inputs, ref_targets = mask_tokens(data.view(3, 100), 10,
                                          generator=torch.Generator().manual_seed(0))
    assert torch.equal(inputs.cpu(), ref_inputs) and torch.equal(targets.cpu(), ref_targets)
