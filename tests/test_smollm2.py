"""SmolLM2-135M-Instruct with real weights: logit parity with `transformers`, and greedy
speculative decoding equal to plain greedy decoding with the n-gram and early-exit drafts.

The reference (logits at 4 positions and 32 greedy tokens, two chat prompts) was produced by
`transformers` from the same GGUF: `tests/fixtures/make_smollm2_reference.py`.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models import gguf_loader
from models.llama import LlamaForward
from models.tokenizer import load_tokenizer

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'smollm2_reference.npz')
LOGIT_TOL = 1e-3  # max abs difference


@pytest.fixture(scope='module')
def model():
  try:
    path = gguf_loader.default_model_path()
  except FileNotFoundError as e:
    pytest.skip(f'SmolLM2 GGUF unavailable: {e}')
  config, params = gguf_loader.load_gguf(path)
  return config, params, load_tokenizer(path)


@pytest.fixture(scope='module')
def reference():
  with np.load(FIXTURE, allow_pickle=False) as data:
    arrays = {k: data[k] for k in data.files}
  return json.loads(str(arrays.pop('meta'))), arrays


@pytest.mark.parametrize('chat', [0, 1])
def test_logits_match_transformers(model, reference, chat):
  config, params, _ = model
  _, ref = reference
  # Metadata -> config, context length included; the GGUF stores eps as float32.
  assert abs(config.norm_eps - 1e-5) < 1e-12
  assert dataclasses.replace(config, norm_eps=1e-5) == gguf_loader.LlamaConfig.smollm2_135m()
  ids = ref[f'chat{chat}_ids']
  forward = LlamaForward(config)
  logits, _ = jax.jit(forward)(params, jnp.asarray(ids[None]), forward.init_cache(1, len(ids)),
                               jnp.zeros((1,), jnp.int32))
  ours = np.asarray(logits[0, ref[f'chat{chat}_positions']])
  assert np.abs(ours - ref[f'chat{chat}_logits']).max() < LOGIT_TOL


def _decode(model, prompts, draft, k):
  config, params, tok = model
  tokens, lengths = js.pad_prompts(prompts, pad_id=tok.pad_id)
  out = js.generate(params, params, tokens, lengths, np.full(len(lengths), 0),
                    target=LlamaForward(config), draft=draft,
                    config=js.DecodeConfig(num_draft_tokens=k, max_new_tokens=64,
                                           sampling=js.SamplingConfig(temperature=0),
                                           pad_id=tok.pad_id))
  return out.new_tokens(), js.summarize(out.metrics)


@pytest.fixture(scope='module')
def plain(model, reference):
  meta, ref = reference
  prompts = [ref['chat0_ids'].tolist(), ref['chat1_ids'].tolist()]
  tokens, summary = _decode(model, prompts, None, 0)
  for b in range(2):  # our greedy decoding reproduces transformers' greedy tokens
    assert tokens[b][:32] == ref[f'chat{b}_greedy'].tolist()
  return prompts, tokens


@pytest.mark.parametrize('draft_name, k', [('ngram', 4), ('early-exit:24', 3)])
def test_greedy_speculative_equals_plain(model, plain, draft_name, k):
  config = model[0]
  prompts, expected = plain
  draft = (js.NGramDraft() if draft_name == 'ngram' else
           js.ModelDraft(LlamaForward(config, num_layers=24), shares_target_cache=True))
  tokens, summary = _decode(model, prompts, draft, k)
  assert tokens == expected
  assert summary['target_forward_passes'] < 128  # some drafts were accepted
