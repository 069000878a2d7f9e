"""jaxspec: exact speculative decoding as pure, jit-compiled JAX functions."""

from jaxspec import noise
from jaxspec.contracts import (DeterministicDraft, Draft, DraftContext, FeatureModel, Model,
                               Prefill, Proposal, Schedule, Scored, Verifier, buffer_length)
from jaxspec.drafts import FeatureDraft, ModelDraft, NGramDraft
from jaxspec.loop import (FINISH_REASONS, DecodeConfig, DecodeResult, DecodeState, commit,
                          compile_generate, decode_step, generate, generate_steps, init_state,
                          pad_prompts, propose, score, speculative_step, validate_inputs, verify)
from jaxspec.metrics import Metrics, summarize
from jaxspec.noise import RowNoise, row_keys
from jaxspec.sampling import SamplingConfig, process_logits
from jaxspec.schedule import CostModel, Cycle, Heuristic, measure_round_costs, measured_cost_model
from jaxspec.verify import (Coupled, Exact, Greedy, Mixture, TypicalAcceptance, parse_verifier,
                            verify_exact, verify_greedy)
from jaxspec.vocab import VocabMappedDraft

__all__ = [
    'CostModel', 'Coupled', 'Cycle', 'DecodeConfig', 'DecodeResult', 'DecodeState',
    'DeterministicDraft', 'Draft', 'DraftContext', 'Exact', 'FINISH_REASONS', 'FeatureDraft',
    'FeatureModel', 'Greedy', 'Heuristic', 'Metrics', 'Mixture', 'Model', 'ModelDraft',
    'NGramDraft', 'Prefill', 'Proposal',
    'RowNoise', 'SamplingConfig', 'Schedule', 'Scored', 'TypicalAcceptance', 'Verifier',
    'VocabMappedDraft', 'buffer_length', 'commit', 'compile_generate', 'decode_step', 'generate',
    'generate_steps', 'init_state', 'measure_round_costs', 'measured_cost_model', 'noise',
    'pad_prompts', 'parse_verifier', 'process_logits', 'propose', 'row_keys', 'score',
    'speculative_step', 'summarize', 'validate_inputs', 'verify', 'verify_exact', 'verify_greedy',
]
