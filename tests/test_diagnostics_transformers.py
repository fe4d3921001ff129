"""d2lattn.diagnostics on real clients: tiny Hugging Face ``transformers`` models (GPT-2, BERT,
Llama) built from configs with random weights (nothing is downloaded). The checks must pass
the models as they are and fail, with the right message, when a mask bug is planted through
the models' own ``attention_mask``, a 4-D mask, or a patched attention function (issue 50).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from d2lattn.diagnostics import check_batch_independence, check_causal, check_padding  # noqa: E402

torch.set_num_threads(1)
V, T = 50, 10
LENS = torch.tensor([T, 7, 4])
LM = dict(input_name="input_ids", output="logits", kwargs={"use_cache": False})
ENCODER = dict(input_name="input_ids", output="last_hidden_state")


def text(result):
    return " ".join(result.message.split())


def ids(seed=0, B=3):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V,
                                     n_positions=32, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1,
                                      vocab_size=V, max_position_embeddings=32, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, vocab_size=V,
                                     max_position_embeddings=32, attn_implementation="eager")
    return transformers.BertModel(config).eval()


# --- correct models pass ------------------------------------------------------------------------

@pytest.mark.parametrize("side", ["right", "left"])
def test_gpt2_passes(gpt2, side):
    assert check_causal(gpt2, ids(), **LM)
    result = check_causal(gpt2, ids(), LENS, mask_name="attention_mask", padding_side=side, **LM)
    assert result.passed and result.details["exact"] is True, result.message
    assert check_padding(gpt2, ids(), LENS, mask_name="attention_mask", **LM)
    assert check_batch_independence(gpt2, ids(), LENS, mask_name="attention_mask", **LM)


def test_llama_passes(llama):
    result = check_causal(llama, ids(), **LM)
    assert result.passed and result.details["exact"] is True, result.message
    assert check_causal(llama, ids(), LENS, mask_name="attention_mask", padding_side="left", **LM)


def test_bert_passes(bert):
    result = check_padding(bert, ids(), LENS, mask_name="attention_mask", **ENCODER)
    assert result.passed and result.details["exact"] is True, result.message
    assert check_batch_independence(bert, ids(), LENS, mask_name="attention_mask", **ENCODER)
    assert not check_causal(bert, ids(), **ENCODER)  # an encoder sees both ways, as it should


# --- planted bugs fail --------------------------------------------------------------------------

def test_gpt2_mask_forgotten_under_left_padding_fails(gpt2):
    def forgets(input_ids, attention_mask):  # the mask never reaches the model
        return gpt2(input_ids=input_ids, use_cache=False).logits

    result = check_causal(forgets, ids(), LENS, mask_name="attention_mask", padding_side="left",
                          input_name="input_ids")
    assert not result.passed and "reads the padding" in text(result), result.message
    # with right padding the forgotten mask does no harm to a causal model: the padding is
    # in every valid position's future, and both checks say so
    assert check_causal(forgets, ids(), LENS, mask_name="attention_mask", input_name="input_ids")
    assert check_padding(forgets, ids(), LENS, mask_name="attention_mask", input_name="input_ids")


def test_bert_mask_convention_inverted_fails(bert):
    def inverted(input_ids, attention_mask):  # 1 = padding, the other convention
        return bert(input_ids=input_ids, attention_mask=1 - attention_mask).last_hidden_state

    result = check_padding(inverted, ids(), LENS, mask_name="attention_mask",
                           input_name="input_ids")
    assert not result.passed and "padded" in text(result), result.message


def test_llama_4d_mask_without_causality_fails(llama):
    def with_mask(input_ids, causal):
        B, T = input_ids.shape
        allowed = torch.ones(T, T, dtype=torch.bool)
        if causal:
            allowed = allowed.tril()
        mask = torch.zeros(T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
        return llama(input_ids=input_ids, attention_mask=mask.expand(B, 1, T, T),
                     use_cache=False).logits

    assert check_causal(lambda x: with_mask(x, True), ids())
    result = check_causal(lambda x: with_mask(x, False), ids())
    assert not result.passed and result.first_position == 0, result.message
    assert "reads the future" in text(result)


def test_gpt2_patched_attention_without_mask_fails(gpt2, monkeypatch):
    module = transformers.models.gpt2.modeling_gpt2
    original = module.eager_attention_forward

    def no_mask(attn_module, query, key, value, attention_mask, *args, **kwargs):
        return original(attn_module, query, key, value, None, *args, **kwargs)

    monkeypatch.setattr(module, "eager_attention_forward", no_mask)
    result = check_causal(gpt2, ids(), **LM)
    assert not result.passed and result.first_position == 0, result.message
    assert result.details["reads"] == list(range(1, T))
