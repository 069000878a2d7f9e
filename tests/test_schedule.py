"""K chosen per round (`jaxspec.schedule`) and per-row early stop: the output is unchanged (greedy:
the plain tokens; sampled: the target's distribution, chi-square at significance 1e-3 with fixed
seeds), the K the schedule picks is the one its rule says, and the draft's state survives K
changing from round to round."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models.llama import LlamaConfig, LlamaForward, init_params
from tests import toys
from tests.test_greedy_identity import AdversarialDraft

CONFIG = LlamaConfig.tiny(tie_embeddings=False)
TARGET = LlamaForward(CONFIG)
PARAMS = init_params(CONFIG, jax.random.key(0))
OTHER_PARAMS = init_params(CONFIG, jax.random.key(1))
PROMPTS = [[1, 2, 3], [5, 9, 11, 13, 2, 7, 30], [4, 4, 8, 15, 16, 23, 42, 4, 8, 15, 16, 23]]
GREEDY = js.SamplingConfig(temperature=0)
MAX_NEW = 24
K_MAX = 4


@dataclasses.dataclass(frozen=True)
class Cycle:
  """A test schedule: round r uses K = ks[r % len(ks)], whatever happened."""

  ks: tuple[int, ...] = (3, 0, 1, 4, 2, 0, 0, 4)

  def branches(self, max_draft_tokens):
    return tuple(range(max_draft_tokens + 1))

  def init(self, batch_size, max_draft_tokens):
    return jnp.int32(0)

  def choose(self, state, active):
    return jnp.asarray(self.ks, jnp.int32)[state % len(self.ks)]

  def update(self, state, before, after, active):
    return state + 1


def _llama_run(draft, draft_params, **config):
  tokens, lengths = js.pad_prompts(PROMPTS, bucket=16)
  config = js.DecodeConfig(max_new_tokens=MAX_NEW, sampling=GREEDY, **config)
  out = js.generate(PARAMS, draft_params, tokens, lengths, np.zeros(len(lengths), int),
                    target=TARGET, draft=draft, config=config)
  return out.new_tokens(), js.summarize(out.metrics)


@pytest.fixture(scope='module')
def plain():
  return _llama_run(None, None, num_draft_tokens=0)[0]


DRAFTS = {
    'perfect': (js.ModelDraft(TARGET), PARAMS),
    'useless': (js.ModelDraft(TARGET), OTHER_PARAMS),
    'ngram': (js.NGramDraft(), None),
    'early_exit': (js.ModelDraft(LlamaForward(CONFIG, num_layers=1), shares_target_cache=True),
                   PARAMS),
}
# Costs under which the best K moves with the acceptance: cheap drafting, pricey wide windows.
COSTS = js.CostModel(ks=(0, 1, 2, 4), round_seconds=(1.0, 1.2, 1.6, 2.4), probe_every=3)
SCHEDULES = {'cycle': Cycle(), 'heuristic': js.Heuristic(initial=1), 'cost_model': COSTS}


@pytest.mark.parametrize('schedule', list(SCHEDULES))
@pytest.mark.parametrize('name', list(DRAFTS))
def test_greedy_identity_under_a_schedule(plain, name, schedule):
  draft, draft_params = DRAFTS[name]
  tokens, summary = _llama_run(draft, draft_params, num_draft_tokens=K_MAX,
                               schedule=SCHEDULES[schedule])
  assert tokens == plain
  if schedule == 'cycle':
    assert sum(1 for n in summary['rounds_by_k'] if n) == 5  # every K = 0..4 was used
  if name == 'perfect':
    assert summary['acceptance_rate'] == 1.0


@pytest.mark.parametrize('threshold', [0.3, 0.9, 1.0])
@pytest.mark.parametrize('name', ['perfect', 'useless', 'early_exit'])
def test_greedy_identity_with_early_stop(plain, name, threshold):
  draft, draft_params = DRAFTS[name]
  tokens, summary = _llama_run(draft, draft_params, num_draft_tokens=K_MAX,
                               min_draft_confidence=threshold)
  assert tokens == plain
  rounds = summary['target_forward_passes']
  assert summary['drafted_tokens'] < K_MAX * rounds  # some rows stopped early
  if threshold == 1.0:  # no softmax reaches 1: every row stops after its first token
    assert summary['drafted_tokens'] <= rounds


def test_feature_draft_state_survives_changing_k():
  """The oracle EAGLE draft accepts everything only if every feature it reads is the right one;
  K changes every round (0 included), so the feature window and cache must be kept at K_max."""
  target, params = toys.FeatureTableModel(), toys.random_table(jax.random.key(0), 12)
  prompts, lengths = js.pad_prompts([[3], [1, 4, 1, 5, 9, 2, 6], [2, 7]], bucket=8)
  for temperature in (0.0, 1.0):
    config = js.DecodeConfig(num_draft_tokens=K_MAX, max_new_tokens=23, schedule=Cycle(),
                             sampling=js.SamplingConfig(temperature=temperature))
    out = js.generate(params, params, prompts, lengths, np.ones(3, int), target=target,
                      draft=js.FeatureDraft(toys.OracleFeatureDraft()), config=config)
    stats = js.summarize(out.metrics)
    assert stats['drafted_tokens'] > 0 and stats['acceptance_rate'] == 1.0
    assert all(len(r) == 23 for r in out.new_tokens())


# --- exactness of sampling (toy table model, V = 5) ---------------------------------------------

V, N, NUM_TOKENS, ALPHA, PROMPT = 5, 20000, 3, 1e-3, [1, 3]
TABLE_TARGET = toys.random_table(jax.random.key(1), V)
TABLE_DRAFT = toys.random_table(jax.random.key(2), V)


def _sample_rows(sampling, verifier, **config):
  prompts = np.tile(np.asarray([PROMPT], np.int32), (N, 1))
  config = js.DecodeConfig(num_draft_tokens=3, max_new_tokens=NUM_TOKENS, sampling=sampling,
                           verifier=verifier, **config)
  out = js.generate(TABLE_TARGET, TABLE_DRAFT, prompts, np.full((N,), len(PROMPT)), np.arange(N),
                    target=toys.TableModel(), draft=js.ModelDraft(toys.TableModel()),
                    config=config)
  return out.new_tokens(), js.summarize(out.metrics)


@pytest.mark.parametrize('verifier', [js.Exact(), js.Coupled()], ids=['exact', 'coupled'])
@pytest.mark.parametrize('setting', ['cost_model', 'heuristic', 'early_stop'])
@pytest.mark.parametrize('sampling', [js.SamplingConfig(temperature=1.0),
                                      js.SamplingConfig(temperature=1.4, top_k=3)],
                         ids=['T1', 'T1.4k3'])
def test_sampling_stays_exact(sampling, setting, verifier):
  config = {'cost_model': dict(schedule=js.CostModel(ks=(0, 1, 2, 3),
                                                     round_seconds=(1.0, 1.3, 1.5, 1.7),
                                                     prior=0.9, decay=1.0, probe_every=1)),
            'heuristic': dict(schedule=js.Heuristic(initial=3)),
            'early_stop': dict(min_draft_confidence=0.6)}[setting]
  rows, summary = _sample_rows(sampling, verifier, **config)
  assert all(len(r) == NUM_TOKENS for r in rows)
  if setting == 'early_stop':
    assert summary['drafted_tokens'] < 3 * summary['target_forward_passes']
  else:
    assert sum(1 for n in summary["rounds_by_k"] if n) >= 2  # K really changed between rounds
  expected = toys.exact_joint(toys.TableModel(), TABLE_TARGET, PROMPT, NUM_TOKENS, sampling)
  assert toys.chi_square_pvalue(toys.joint_counts(rows, NUM_TOKENS, V), expected) > ALPHA


# --- the rules themselves ------------------------------------------------------------------------

def test_cost_model_expected_tokens_match_a_reference():
  model = js.CostModel(ks=(0, 1, 3), round_seconds=(1.0, 1.0, 1.0))
  alpha = np.array([[0.5, 0.8, 0.1], [1.0, 1.0, 1.0], [0.0, 0.9, 0.9]], np.float32)
  state = js.schedule.CostModelState(jnp.asarray(alpha), jnp.int32(0))
  active = np.array([True, True, False])
  got = np.asarray(model.expected_tokens(state, jnp.asarray(active)))
  ref = [sum(1 + sum(np.prod(a[:j + 1]) for j in range(k)) for a in alpha[active])
         for k in (0, 1, 3)]
  np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_cost_model_turns_speculation_off_when_the_draft_costs_too_much():
  """Rounds that draft cost 10x a plain step: even a perfect-looking prior says K = 0, and it
  drafts only in one probe after every `probe_every` plain rounds."""
  schedule = js.CostModel(ks=(0, 1, 4), round_seconds=(1.0, 10.0, 10.0), prior=1.0,
                          probe_every=5)
  tokens, summary = _llama_run(*DRAFTS['useless'], num_draft_tokens=4, schedule=schedule)
  rounds = summary['rounds_by_k']
  assert rounds[0] > 0 and rounds[2] == rounds[3] == 0
  assert 0 < rounds[1] <= rounds[0] // 5 + len(PROMPTS)  # the probes
  assert rounds[4] == 0


def test_cost_model_drafts_the_most_with_a_perfect_draft():
  schedule = js.CostModel(ks=(0, 1, 2, 4), round_seconds=(1.0, 1.1, 1.2, 1.4), prior=0.9)
  _, summary = _llama_run(*DRAFTS['perfect'], num_draft_tokens=4, schedule=schedule)
  rounds = summary['rounds_by_k']
  assert rounds[4] > 0 and rounds[0] == rounds[1] == rounds[2] == 0


def test_heuristic_follows_transformers_rule():
  """K starts at 1 and grows by 2 while every drafted token is accepted (perfect draft), capped at
  K_max; with a draft that is never right it stays at 1."""
  _, summary = _llama_run(*DRAFTS['perfect'], num_draft_tokens=4, schedule=js.Heuristic(initial=1))
  assert summary['rounds_by_k'][1] == summary['rounds_by_k'][3] == len(PROMPTS)  # one round each
  assert summary['rounds_by_k'][2] == 0 and summary['rounds_by_k'][4] > 0
  _, summary = _llama_run(AdversarialDraft(TARGET), PARAMS, num_draft_tokens=4,
                          schedule=js.Heuristic(initial=1))
  assert summary['rounds_by_k'][1] == summary['target_forward_passes']


def test_measured_round_costs():
  tokens, lengths = js.pad_prompts(PROMPTS, bucket=16)
  config = js.DecodeConfig(num_draft_tokens=2, max_new_tokens=8, sampling=GREEDY)
  costs = js.measure_round_costs(PARAMS, PARAMS, tokens, lengths, np.zeros(3, int),
                                 target=TARGET, draft=js.ModelDraft(TARGET), config=config,
                                 ks=(0, 1, 2), rounds=2, repeats=1)
  assert len(costs) == 3 and all(c > 0 for c in costs)
  with pytest.raises(ValueError, match='num_draft_tokens=2'):
    js.measure_round_costs(PARAMS, PARAMS, tokens, lengths, np.zeros(3, int), target=TARGET,
                           draft=js.ModelDraft(TARGET), config=config, ks=(0, 3))


@pytest.mark.parametrize('kwargs, message', [
    (dict(num_draft_tokens=0, schedule=js.Heuristic()), 'num_draft_tokens >= 1'),
    (dict(num_draft_tokens=2, schedule=js.CostModel(ks=(0, 4), round_seconds=(1., 2.))),
     'more than num_draft_tokens'),
    (dict(num_draft_tokens=2, schedule='auto'), 'jaxspec schedule'),
    (dict(min_draft_confidence=1.5), 'min_draft_confidence'),
])
def test_bad_schedule_settings_rejected(kwargs, message):
  with pytest.raises(ValueError, match=message):
    js.DecodeConfig(**kwargs)


@pytest.mark.parametrize('kwargs', [dict(ks=(1, 0), round_seconds=(1., 1.)),
                                    dict(ks=(0, 1), round_seconds=(1.,)),
                                    dict(ks=(0, 1), round_seconds=(1., 0.)),
                                    dict(ks=(0, 1), round_seconds=(1., 1.), decay=0.)])
def test_bad_cost_model_rejected(kwargs):
  with pytest.raises(ValueError):
    js.CostModel(**kwargs)
