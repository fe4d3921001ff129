"""One training loop (``d2lattn.training.fit``) and one convention for every ``train_*`` function.

Two kinds of test. The convention: the same keyword names, the callback ``(step, model, loss)``
after each step with ``step`` from 1, ``stop_after`` as the start of the longer run, ``clip``
wired in, a non-finite loss that stops training, the model left in eval mode. And unchanged
numerics: each loop gives, bit for bit, the losses and weights of the loop it replaced (written
out below as it was), because the chapters' committed outputs and the tables in ``book/data``
were made with those.
"""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from d2lattn import (AttentionDecoder, CharVocab, DotProductAttention, EncoderDecoder,
                     Seq2SeqEncoder, fit, length_batches, make_multi_date_examples, seq2seq_loss,
                     train_seq2seq)
from d2lattn.circuits import (AttentionOnlyTransformer, induction_loss, repeated_sequences,
                              train_induction)
from d2lattn.gpt import GPT, GPTConfig, lr_schedule, mask_tokens, train_lm
from d2lattn.graphs import GraphNodeClassifier, make_block_graph, train_node_classifier
from d2lattn.sets import SetRegressor, make_diameter_sets, train_set_model
from d2lattn.text import random_windows

STEPS = 6


def _lm_data():
    return torch.randint(0, 20, (2000,), generator=torch.Generator().manual_seed(5))


def _dates():
    train = make_multi_date_examples(200, [1, 2], seed=100)
    src, tgt = CharVocab([ex.source for ex in train]), CharVocab([ex.target for ex in train])
    X, X_lens = src.encode_batch([ex.source for ex in train])
    Y, Y_lens = tgt.encode_batch([ex.target for ex in train], eos=True)
    return len(src), len(tgt), X, X_lens, Y, Y_lens


def _sets():
    P, lens, y = make_diameter_sets(96, seed=0)
    return P, lens, (y - y.mean()) / y.std()


def _graph():
    X, A, y = make_block_graph(num_nodes=90, seed=0)
    return X, A, y, torch.arange(0, 90, 4)


# --- the loops as they were before they shared fit (issue 40) ----------------------------------

def reference_lm(model, data, steps, *, batch_size, lr, warmup, seed, clip=1.0, mask_id=None,
                 weight_decay=0.1, min_ratio=0.1, stop_after=None):
    T = model.config.block_size
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for step in range(steps if stop_after is None else min(steps, stop_after)):
        for group in opt.param_groups:
            group["lr"] = lr_schedule(step, steps, lr, warmup=warmup, min_ratio=min_ratio)
        X, Y = random_windows(data, batch_size, T, generator=generator)
        if mask_id is not None:
            X, Y = mask_tokens(X, mask_id, rate=0.15, generator=generator)
        loss = F.cross_entropy(model(X).flatten(0, 1), Y.flatten())
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    model.eval()
    return losses


def reference_induction(model, steps, *, vocab, seq_len, periods, batch_size, lr, seed):
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        tokens, _ = repeated_sequences(batch_size, seq_len, vocab, periods, generator=generator)
        loss = induction_loss(model(tokens), tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def reference_seq2seq(model, X, X_lens, Y, Y_lens, *, steps, batch_size, lr, seed,
                      max_grad_norm=None):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    batches, losses = [], []
    for _ in range(steps):
        if not batches:
            batches = length_batches(X_lens.tolist(), batch_size, generator=g)
        idx = batches.pop()
        T, U = int(X_lens[idx].max()), int(Y_lens[idx].max())
        loss = seq2seq_loss(model, X[idx, :T], X_lens[idx], Y[idx, :U], Y_lens[idx])
        optimizer.zero_grad()
        loss.backward()
        if max_grad_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses


def reference_sets(model, X, lens, y, *, steps, batch_size, lr, seed, stop_after=None):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(steps if stop_after is None else min(steps, stop_after)):
        idx = torch.randint(len(X), (batch_size,), generator=generator)
        value = F.mse_loss(model(X[idx], lens[idx]), y[idx])
        losses.append(value.item())
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        schedule.step()
    model.eval()
    return losses


def reference_nodes(model, X, A, y, nodes, *, epochs, lr=5e-3, weight_decay=5e-4):
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(epochs):
        model.train()
        loss = F.cross_entropy(model(X, A)[nodes], y[nodes])
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return losses


# --- each loop: a model, the library call, and the reference call ------------------------------

def _lm_model(dropout=0.1, causal=True):
    return GPT(GPTConfig(vocab_size=20 if causal else 21, block_size=12, num_hiddens=16,
                         num_heads=2, num_layers=1, ffn_num_hiddens=32, dropout=dropout,
                         causal=causal))


def _seq2seq_model():
    n_src, n_tgt = _dates()[:2]
    return EncoderDecoder(Seq2SeqEncoder(n_src, 8, 16),
                          AttentionDecoder(n_tgt, 8, 16, DotProductAttention()))


LOOPS = {
    "train_lm": (
        _lm_model,
        lambda m, **kw: train_lm(m, _lm_data(), batch_size=8, lr=3e-3, warmup=2, seed=1, **kw),
        lambda m, steps, **kw: reference_lm(m, _lm_data(), steps, batch_size=8, lr=3e-3,
                                            warmup=2, seed=1, **kw)),
    "train_lm (masked)": (
        lambda: _lm_model(0.0, causal=False),
        lambda m, **kw: train_lm(m, _lm_data(), batch_size=8, lr=1e-2, warmup=2, seed=2,
                                 mask_id=20, **kw),
        lambda m, steps, **kw: reference_lm(m, _lm_data(), steps, batch_size=8, lr=1e-2,
                                            warmup=2, seed=2, mask_id=20, **kw)),
    "train_induction": (
        lambda: AttentionOnlyTransformer(10, num_hiddens=16, num_heads=2),
        lambda m, **kw: train_induction(m, vocab=10, seq_len=12, periods=(3, 5), batch_size=8,
                                        lr=3e-3, seed=3, **kw),
        lambda m, steps, **kw: reference_induction(m, steps, vocab=10, seq_len=12,
                                                   periods=(3, 5), batch_size=8, lr=3e-3,
                                                   seed=3)),
    "train_seq2seq": (
        _seq2seq_model,
        lambda m, **kw: train_seq2seq(m, *_dates()[2:], batch_size=64, lr=0.02, seed=4,
                                      clip=kw.pop("clip", 0.5), **kw),
        lambda m, steps, **kw: reference_seq2seq(m, *_dates()[2:], steps=steps, batch_size=64,
                                                 lr=0.02, seed=4, max_grad_norm=0.5)),
    "train_set_model": (
        lambda: SetRegressor("isab", 2, num_hiddens=16),
        lambda m, **kw: train_set_model(m, *_sets(), batch_size=16, lr=3e-3, seed=5,
                                        loss="mse", **kw),
        lambda m, steps, **kw: reference_sets(m, *_sets(), steps=steps, batch_size=16, lr=3e-3,
                                              seed=5, **kw)),
    "train_node_classifier": (
        lambda: GraphNodeClassifier("gat", 8, 3),
        lambda m, **kw: train_node_classifier(m, *_graph(), **kw),
        lambda m, steps, **kw: reference_nodes(m, *_graph(), epochs=steps)),
}


def _run(fn, make, **kw):
    torch.manual_seed(0)
    model = make()
    losses = fn(model, **kw)
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, torch.rand(2)


@pytest.mark.parametrize("name", LOOPS)
def test_every_loop_gives_the_losses_and_weights_of_the_loop_it_replaced(name):
    """Bit for bit: the same losses, the same weights, the same global generator after it."""
    make, new, reference = LOOPS[name]
    losses, weights, after = _run(new, make, steps=STEPS)
    ref_losses, ref_weights, ref_after = _run(reference, make, steps=STEPS)
    assert losses == ref_losses and len(losses) == STEPS
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights)
    assert torch.equal(after, ref_after)  # dropout drew from the global generator alike


@pytest.mark.parametrize("name", LOOPS)
def test_every_loop_follows_the_convention(name):
    make, new, _ = LOOPS[name]
    fn = {"train_lm": train_lm, "train_induction": train_induction,
          "train_seq2seq": train_seq2seq, "train_set_model": train_set_model,
          "train_node_classifier": train_node_classifier}[name.split()[0]]
    params = inspect.signature(fn).parameters
    for shared in ("steps", "lr", "stop_after", "clip", "callback"):
        assert params[shared].kind is inspect.Parameter.KEYWORD_ONLY, shared
    assert params["callback"].default is None and params["stop_after"].default is None
    if name != "train_node_classifier":  # full batch: nothing is drawn
        assert params["seed"].kind is params["batch_size"].kind is inspect.Parameter.KEYWORD_ONLY

    calls = []
    losses, _, _ = _run(new, make, steps=STEPS,
                        callback=lambda step, model, loss: calls.append(
                            (step, loss, model.training)))
    assert all(isinstance(x, float) for x in losses) and len(losses) == STEPS
    assert calls == [(s, losses[s - 1], True) for s in range(1, STEPS + 1)]
    # stop_after retraces the start of the longer run (the same schedule, the same batches)
    short, _, _ = _run(new, make, steps=STEPS, stop_after=3)
    assert short == losses[:3]
    # the callback may leave the model in eval mode: the next step trains again
    modes = []
    _run(new, make, steps=3, callback=lambda step, model, loss: (modes.append(model.training),
                                                                 model.eval()))
    assert modes == [True, True, True]
    # clip is wired in: a tiny norm changes the run
    clipped, _, _ = _run(new, make, steps=STEPS, clip=1e-4)
    assert clipped[0] == losses[0] and clipped[1:] != losses[1:]


def test_fit_leaves_the_model_in_eval_mode_and_stops_at_a_non_finite_loss():
    torch.manual_seed(0)
    w = nn.Sequential(nn.Linear(2, 1), nn.Dropout(0.1))
    opt = torch.optim.SGD(w.parameters(), lr=0.1)
    x = torch.randn(4, 2)
    values = iter([1.0, 2.0, math.inf, 3.0])
    seen = []

    def batch_loss():
        return w(x).sum() * 0 + next(values)

    before = [p.clone() for p in w.parameters()]
    losses = fit(w, opt, batch_loss, steps=4, callback=lambda s, m, loss: seen.append(s))
    assert losses == [1.0, 2.0, math.inf] and seen == [1, 2] and not w.training
    # the loss is constant in the weights: the two finite steps moved nothing, the third no step
    assert all(torch.equal(p, q) for p, q in zip(before, w.parameters()))


def test_fit_sets_the_learning_rate_of_every_step_and_steps_a_scheduler():
    w = nn.Linear(1, 1)
    opt = torch.optim.SGD(w.parameters(), lr=1.0)
    seen = []
    fit(w, opt, lambda: w(torch.ones(1, 1)).sum(), steps=3, lr_at=lambda i: 0.1 * (i + 1),
        callback=lambda s, m, loss: seen.append(opt.param_groups[0]["lr"]))
    assert seen == [0.1, 0.2, 0.1 * 3]
    opt = torch.optim.SGD(w.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen = []
    fit(w, opt, lambda: w(torch.ones(1, 1)).sum(), steps=3, scheduler=sched,
        callback=lambda s, m, loss: seen.append(opt.param_groups[0]["lr"]))
    assert seen == [0.5, 0.25, 0.125]  # read after each step's scheduler step


@pytest.mark.parametrize("bad, match", [(dict(steps=0), "steps"), (dict(steps=2.0), "steps"),
                                        (dict(steps=3, stop_after=0), "stop_after"),
                                        (dict(steps=3, clip=-1.0), "clip"),
                                        (dict(steps=3, clip=math.nan), "clip")])
def test_fit_names_a_bad_argument(bad, match):
    w = nn.Linear(1, 1)
    with pytest.raises(ValueError, match=match):
        fit(w, torch.optim.SGD(w.parameters(), lr=0.1), lambda: w(torch.ones(1, 1)).sum(), **bad)
    with pytest.raises(ValueError, match=match):
        train_induction(AttentionOnlyTransformer(6, num_hiddens=8, num_heads=2), vocab=6,
                        seq_len=8, periods=(2, 3), **bad)
