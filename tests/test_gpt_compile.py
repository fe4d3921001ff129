"""GPT compiles as one graph: ``torch.compile(fullgraph=True)`` traces it without a graph
break (the checks that read tensor values are skipped while compiling; shape checks stay), and
the compiled model equals the eager one in eval and train mode, learned and rotary positions.

The model is tiny and the backends are Dynamo's own (``eager`` traces the graph, ``aot_eager``
also traces the backward pass), so the test costs seconds, not inductor's minutes; whether a
model compiles as one graph is decided by the trace, which is the same for every backend."""

import pytest
import torch

from d2lattn import GPT, GPTConfig

torch._dynamo.config.cache_size_limit = 64  # the parametrised models are distinct graphs


def _tiny(positions: str) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=16, num_hiddens=16, num_heads=2,
                       num_layers=2, ffn_num_hiddens=32, positions=positions, dropout=0.0)
    return GPT(config).double()


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_gpt_traces_as_one_graph(positions):
    model, tokens = _tiny(positions), torch.randint(0, 11, (2, 8))
    for mode in ("eval", "train"):
        getattr(model, mode)()
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(tokens)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
            explained.break_reasons


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_compiled_gpt_equals_eager_values_and_gradients(positions):
    model, tokens = _tiny(positions), torch.randint(0, 11, (2, 8))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    model.train()  # dropout 0: train mode is deterministic
    out = compiled(tokens)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(tokens)
    ref.square().mean().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=1e-12)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens), model(tokens), rtol=0, atol=1e-12)


def test_eager_still_checks_values_and_compiled_still_checks_shapes():
    model = _tiny("rotary").eval()
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        model(torch.tensor([[3, 11]]))  # eager: the token range is read
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")  # a raise ends a graph: no fullgraph
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        compiled(torch.zeros(2, 3, 4, dtype=torch.long))  # compiled: shapes are still checked
    with pytest.raises((IndexError, RuntimeError)):  # the embedding itself refuses id 11
        compiled(torch.tensor([[3, 11]]))  # compiled: the range check is not read


@pytest.mark.parametrize("kind", ["mla", "linear", "delta", "gated_delta"])
def test_gpt_with_other_attention_kinds_traces_as_one_graph(kind):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=16, num_hiddens=16, num_heads=2,
                       num_layers=2, ffn_num_hiddens=32, attention=kind,
                       positions="rotary" if kind == "mla" else "learned")
    model = GPT(config).eval()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(torch.randint(0, 11, (2, 8)))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        explained.break_reasons
