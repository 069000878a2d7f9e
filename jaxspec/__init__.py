"""jaxspec: exact speculative decoding as pure, jit-compiled JAX functions."""

from jaxspec.drafts import FeatureDraft, ModelDraft, NGramDraft
from jaxspec.loop import (DecodeConfig, DecodeResult, DecodeState, compile_generate, generate,
                          generate_steps, init_state, pad_prompts, speculative_step, validate_inputs)
from jaxspec.metrics import Metrics, summarize
from jaxspec.sampling import SamplingConfig, process_logits, sample
from jaxspec.verify import verify_exact, verify_greedy

__all__ = [
    'DecodeConfig', 'DecodeResult', 'DecodeState', 'FeatureDraft', 'Metrics', 'ModelDraft',
    'NGramDraft', 'SamplingConfig', 'compile_generate', 'generate', 'generate_steps', 'init_state',
    'pad_prompts', 'process_logits', 'sample', 'speculative_step', 'summarize', 'validate_inputs',
    'verify_exact', 'verify_greedy',
]
