"""Verifiers by name, per-row seeds, and bad numbers.

- `Coupled` (Daliri et al. 2024) gives token for token what plain sampling gives with the same
  seeds, for every draft and K (a tiny Llama, K from 1 to 8).
- A row's tokens depend on its prompt and seed only: alone, or at any index of a batch of 3 or 8.
- The lossy rules match their stated output distribution, stay within their stated total
  variation from the target, and are told apart from it (chi-square, alpha = 1e-3, fixed seeds).
- NaN / inf logits end a row `nonfinite` without emitting a token drawn from them; drafted ids
  outside [0, V) are never emitted; a tiny temperature is the greedy limit.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models.llama import LlamaConfig, LlamaForward, init_params
from tests import toys

ALPHA = 1e-3
CONFIG = LlamaConfig.tiny(tie_embeddings=False)
TARGET = LlamaForward(CONFIG)
PARAMS = init_params(CONFIG, jax.random.key(0))
OTHER = init_params(CONFIG, jax.random.key(1))
PROMPTS = [[1, 2, 3], [5, 9, 11, 13, 2, 7, 30], [4, 4, 8, 15, 16, 23, 42, 4, 8, 15, 16, 23]]
SAMPLED = js.SamplingConfig(temperature=0.8)
MAX_NEW = 20


def _decode(prompts, seeds, draft, draft_params, k, sampling=SAMPLED, verifier=None,
            max_new=MAX_NEW, bucket=16):
  tokens, lengths = js.pad_prompts(prompts, bucket=bucket)
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=max_new, sampling=sampling,
                           verifier=verifier)
  return js.generate(PARAMS, draft_params, tokens, lengths, np.asarray(seeds), target=TARGET,
                     draft=draft, config=config)


DRAFTS = {
    'other_model': (js.ModelDraft(TARGET), OTHER),
    'ngram': (js.NGramDraft(), None),
    'early_exit': (js.ModelDraft(LlamaForward(CONFIG, num_layers=1), shares_target_cache=True),
                   PARAMS),
}


# (draft, K values): K = 1..3, a middle and the largest for a separate draft model, two for the
# others (each case compiles the decode loop; every K = 1..8 cost a minute).
COUPLED_CASES = [('other_model', (1, 2, 3, 5, 8)), ('ngram', (1, 5)), ('early_exit', (2, 7))]


@pytest.mark.parametrize('sampling, cases', [
    (SAMPLED, COUPLED_CASES),
    (js.SamplingConfig(temperature=1.2, top_k=9), [('other_model', (3,))]),
    (js.SamplingConfig(temperature=0.7, top_p=0.9), [('other_model', (3,))]),
], ids=['T0.8', 'T1.2k9', 'T0.7p0.9'])
def test_coupled_tokens_equal_plain_sampling(sampling, cases):
  """Drafter invariance: each draft and K gives exactly the plain sampled tokens."""
  seeds = [11, 12, 13]
  plain = _decode(PROMPTS, seeds, None, None, 0, sampling).new_tokens()
  assert len({tuple(r) for r in plain}) == 3
  accepted = 0
  for name, ks in cases:
    draft, dp = DRAFTS[name]
    for k in ks:
      out = _decode(PROMPTS, seeds, draft, dp, k, sampling, js.Coupled())
      assert out.new_tokens() == plain, (name, k)
      accepted += js.summarize(out.metrics)['accepted_tokens']
  assert accepted > 0


@pytest.mark.parametrize('verifier', [js.Exact(), js.Coupled()], ids=['exact', 'coupled'])
def test_row_tokens_do_not_depend_on_the_batch(verifier):
  """The same prompt and seed alone, and at every index of batches of 3 and 8 with other rows."""
  draft, dp = DRAFTS['other_model']
  prompt, seed = PROMPTS[1], 11
  alone = _decode([prompt], [seed], draft, dp, 3, verifier=verifier).new_tokens()[0]
  others = [PROMPTS[0], PROMPTS[2], [7, 7, 7], [2], [9, 8, 7, 6, 5, 4, 3, 2, 1, 40, 41, 42, 43],
            [17, 3], [33, 34, 35]]
  for size in (3, 8):
    for index in range(size):
      rows = others[:size - 1]
      rows.insert(index, prompt)
      seeds = [100 + i for i in range(size)]
      seeds[index] = seed
      out = _decode(rows, seeds, draft, dp, 3, verifier=verifier).new_tokens()
      assert out[index] == alone, (size, index)
  # The seed matters: another seed gives other tokens.
  assert _decode([prompt], [seed + 1], draft, dp, 3, verifier=verifier).new_tokens()[0] != alone


def test_tiny_temperature_is_greedy():
  """1e-9, 1e-30 and 1e-40 (subnormal in float32) give the greedy tokens, never garbage."""
  greedy = _decode(PROMPTS, [0, 0, 0], None, None, 0, js.SamplingConfig(temperature=0))
  runs = [(1e-9, *DRAFTS['other_model'], 3), (1e-9, None, None, 0), (1e-30, None, None, 0),
          (1e-40, None, None, 0)]
  for temperature, draft, dp, k in runs:
    out = _decode(PROMPTS, [1, 2, 3], draft, dp, k, js.SamplingConfig(temperature=temperature))
    assert out.new_tokens() == greedy.new_tokens(), (temperature, k)


# --- lossy rules: the stated output distribution and TV bound, on the first generated token ---

V, N = 5, 20000
TABLE_TARGET = toys.random_table(jax.random.key(1), V)
TABLE_DRAFT = toys.random_table(jax.random.key(2), V)


def _first_token_counts(verifier, sampling, k=2):
  prompts = np.tile(np.asarray([[1, 3]], np.int32), (N, 1))
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=1, sampling=sampling,
                           verifier=verifier)
  out = js.generate(TABLE_TARGET, TABLE_DRAFT, prompts, np.full((N,), 2), np.arange(N),
                    target=toys.TableModel(), draft=js.ModelDraft(toys.TableModel()),
                    config=config)
  return np.bincount(np.asarray(out.tokens)[:, 2], minlength=V)


def _first_p_q(sampling):
  """The target's and draft's processed distributions of the first new token (after token 3 at
  position 1), float64."""
  p = js.process_logits(TABLE_TARGET['table'][1, 3], sampling)
  q = js.process_logits(TABLE_DRAFT['table'][1, 3], sampling)
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  return p / p.sum(), q / q.sum()


def _tv(a, b):
  return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


@pytest.mark.parametrize('verifier', [js.Mixture(0.3), js.Mixture(0.7),
                                      js.TypicalAcceptance(0.3, 0.09),
                                      js.TypicalAcceptance(0.6, 0.5)], ids=repr)
def test_lossy_rule_matches_its_stated_loss(verifier):
  sampling = js.SamplingConfig(temperature=1.0)
  p, q = _first_p_q(sampling)
  if isinstance(verifier, js.Mixture):
    stated = verifier.weight * p + (1 - verifier.weight) * q
    bound = (1 - verifier.weight) * _tv(p, q)
  else:
    accepted = np.asarray(verifier.accepted_set(jnp.asarray(p, jnp.float32)))
    stated = q * accepted + (1 - q[accepted].sum()) * p
    bound = q[accepted].sum()
  stated /= stated.sum()
  counts = _first_token_counts(verifier, sampling)
  assert verifier.lossy
  assert toys.chi_square_pvalue(counts, stated) > ALPHA  # the distribution the docstring states
  assert _tv(stated, p) <= bound + 1e-9
  assert _tv(stated, p) > 0.02  # lossy for real on this toy ...
  assert toys.chi_square_pvalue(counts, p) < ALPHA  # ... and the test can tell


@pytest.mark.parametrize('verifier', [js.Exact(), js.Coupled()], ids=['exact', 'coupled'])
def test_exact_rules_first_token_follows_target(verifier):
  sampling = js.SamplingConfig(temperature=1.0)
  assert not verifier.lossy
  p, _ = _first_p_q(sampling)
  assert toys.chi_square_pvalue(_first_token_counts(verifier, sampling), p) > ALPHA


def test_lossy_rules_only_by_name():
  assert isinstance(js.DecodeConfig(sampling=SAMPLED).rule, js.Exact)
  assert isinstance(js.DecodeConfig(sampling=js.SamplingConfig(temperature=0)).rule, js.Greedy)
  assert isinstance(js.DecodeConfig(sampling=js.SamplingConfig(temperature=0),
                                    verifier=js.Coupled()).rule, js.Greedy)
  with pytest.raises(ValueError, match='temperature 0'):
    js.DecodeConfig(sampling=js.SamplingConfig(temperature=0), verifier=js.Mixture(0.5))
  with pytest.raises(ValueError, match='verifier'):
    js.DecodeConfig(verifier='exact')
  with pytest.raises(ValueError, match='temperature 0'):
    js.DecodeConfig(sampling=SAMPLED, verifier=js.Greedy())
  assert js.parse_verifier('mixture:0.25') == js.Mixture(0.25)
  assert js.parse_verifier('typical:0.3,0.09') == js.TypicalAcceptance(0.3, 0.09)
  for bad in ('bogus', 'greedy', 'mixture', 'mixture:2', 'typical:0.3', 'exact:1'):
    with pytest.raises(ValueError, match='verifier'):
      js.parse_verifier(bad)


# --- bad numbers and bad ids ---

BAD_TOKEN = 4  # the target's logits after this token are broken


def _broken_table(kind):
  table = np.asarray(TABLE_TARGET['table']).copy()
  if kind == 'nan':
    table[:, BAD_TOKEN, :] = np.nan
  elif kind == '+inf':
    table[:, BAD_TOKEN, 2] = np.inf
  elif kind == '-inf':
    table[:, BAD_TOKEN, :] = -np.inf
  return {'table': jnp.asarray(table)}


@pytest.mark.parametrize('verifier, sampling', [
    (None, js.SamplingConfig(temperature=0)), (js.Exact(), js.SamplingConfig(temperature=1.0)),
    (js.Coupled(), js.SamplingConfig(temperature=1.0))], ids=['greedy', 'exact', 'coupled'])
@pytest.mark.parametrize('kind', ['nan', '+inf', '-inf'])
@pytest.mark.parametrize('k', [0, 3])
def test_nonfinite_logits_end_the_row(kind, verifier, sampling, k):
  """Rows that reach the broken token stop right after it, `nonfinite`; every other row, and
  every row up to that point, is what a clean target gives (same seeds)."""
  prompts = [[1, 3], [0, 1], [2, 2], [3, 0], [1, 1], [0, 0], [2, 3], [3, 3]]
  tokens, lengths = js.pad_prompts(prompts, bucket=4)
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=12, sampling=sampling,
                           verifier=verifier)
  draft = js.ModelDraft(toys.TableModel()) if k else None
  run = lambda table: js.generate(table, TABLE_DRAFT, tokens, lengths, np.arange(8),
                                  target=toys.TableModel(), draft=draft, config=config)
  clean, broken = run(TABLE_TARGET), run(_broken_table(kind))
  reasons = broken.finish_reasons()
  assert 'nonfinite' in reasons and set(reasons) <= {'nonfinite', 'length'}
  for row, clean_row, why, prompt in zip(broken.new_tokens(), clean.new_tokens(), reasons,
                                         prompts):
    assert all(0 <= t < V for t in row)
    if why == 'nonfinite':
      hit = ([prompt[-1]] + row).index(BAD_TOKEN)
      assert row == clean_row[:hit] and len(row) < 12
    else:
      assert row == clean_row and BAD_TOKEN not in [prompt[-1]] + row[:-1]


@dataclasses.dataclass(frozen=True)
class OutOfVocabDraft(js.ModelDraft):
  """Proposes -1 (vLLM's placeholder) at drafted index 1 and V at index 2."""

  def propose(self, params, state, ctx):
    proposal = super().propose(params, state, ctx)
    tokens = proposal.tokens.at[:, 1].set(-1).at[:, 2].set(ctx.vocab_size)
    return dataclasses.replace(proposal, tokens=tokens)


@pytest.mark.parametrize('verifier, sampling', [
    (None, js.SamplingConfig(temperature=0)), (js.Exact(), SAMPLED), (js.Coupled(), SAMPLED)],
    ids=['greedy', 'exact', 'coupled'])
def test_out_of_vocabulary_draft_ids_are_never_emitted(verifier, sampling):
  out = _decode(PROMPTS, [1, 2, 3], OutOfVocabDraft(TARGET), PARAMS, 4, sampling, verifier)
  rows = out.new_tokens()
  assert all(0 <= t < CONFIG.vocab_size for r in rows for t in r)
  stats = js.summarize(out.metrics)
  assert stats['drafted_tokens'] <= stats['target_forward_passes']  # index 0 only is drafted
  if not isinstance(verifier, js.Exact):
    plain = _decode(PROMPTS, [1, 2, 3], None, None, 0, sampling).new_tokens()
    assert rows == plain


def test_nonfinite_draft_stops_the_row_only_where_used():
  """A draft whose q is NaN: under the exact rule the replacement token reads q, so the row ends
  `nonfinite` with valid ids only."""
  table = np.asarray(TABLE_DRAFT['table']).copy()
  table[:, :, :] = np.nan
  prompts = np.tile(np.asarray([[1, 3]], np.int32), (4, 1))
  out = js.generate(TABLE_TARGET, {'table': jnp.asarray(table)}, prompts, np.full((4,), 2),
                    np.arange(4), target=toys.TableModel(),
                    draft=js.ModelDraft(toys.TableModel()),
                    config=js.DecodeConfig(num_draft_tokens=2, max_new_tokens=6,
                                           sampling=js.SamplingConfig(temperature=1.0)))
  assert out.finish_reasons() == ['nonfinite'] * 4
  assert out.new_tokens() == [[]] * 4
