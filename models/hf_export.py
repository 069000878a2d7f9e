"""Export of trained drafts as Hugging Face `LlamaForCausalLM` directories (config.json +
model.safetensors), usable as `assistant_model` in `transformers`.

Each exportable kind declares, in `models.registry`, how its params become a stack of Llama
blocks, a final norm and a reduced head (`exit_blocks`, `small_blocks`); `export_hf` writes them.
The reduced head becomes a full `lm_head` whose rows outside the draft vocabulary are zero, i.e.
logit 0 instead of -inf: for greedy assisted generation this only matters where every draft-
vocabulary logit is negative; transformers' verification keeps the output exact either way.
"""

from __future__ import annotations

import json
import os

import numpy as np


def _block_to_hf(block, i):
  """Our block params -> HF tensors `model.layers.{i}.*` ((out, in) layout)."""
  a, m = block['attn'], block['mlp']
  t = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))
  d = a['q']['kernel'].shape[0]
  pre = f'model.layers.{i}.'
  return {
      pre + 'self_attn.q_proj.weight': t(np.asarray(a['q']['kernel']).reshape(d, -1).T),
      pre + 'self_attn.k_proj.weight': t(np.asarray(a['k']['kernel']).reshape(d, -1).T),
      pre + 'self_attn.v_proj.weight': t(np.asarray(a['v']['kernel']).reshape(d, -1).T),
      pre + 'self_attn.o_proj.weight': t(np.asarray(a['o']['kernel']).reshape(-1, d).T),
      pre + 'mlp.gate_proj.weight': t(np.asarray(m['gate']['kernel']).T),
      pre + 'mlp.up_proj.weight': t(np.asarray(m['up']['kernel']).T),
      pre + 'mlp.down_proj.weight': t(np.asarray(m['down']['kernel']).T),
      pre + 'input_layernorm.weight': t(block['attn_norm']['scale']),
      pre + 'post_attention_layernorm.weight': t(block['mlp_norm']['scale']),
  }


def _adapter_block(config, adapter, like):
  """A block equal to `x + MLP_adapter(norm(x))`: zero attention output, zero-padded MLP."""
  f, pad = adapter['gate'].shape[1], config.mlp_dim - adapter['gate'].shape[1]
  if pad < 0:
    raise ValueError(f'adapter MLP width {f} exceeds the target MLP width {config.mlp_dim}')
  z = lambda x: np.zeros_like(np.asarray(x))
  return {
      'attn': {'q': {'kernel': like['attn']['q']['kernel']},
               'k': {'kernel': like['attn']['k']['kernel']},
               'v': {'kernel': like['attn']['v']['kernel']},
               'o': {'kernel': z(like['attn']['o']['kernel'])}},
      'attn_norm': {'scale': np.ones((config.embed_dim,), np.float32)},
      'mlp': {'gate': {'kernel': np.pad(np.asarray(adapter['gate']), ((0, 0), (0, pad)))},
              'up': {'kernel': np.pad(np.asarray(adapter['up']), ((0, 0), (0, pad)))},
              'down': {'kernel': np.pad(np.asarray(adapter['down']), ((0, pad), (0, 0)))}},
      'mlp_norm': {'scale': np.asarray(adapter['norm'])},
  }


def exit_blocks(config, target_params, forward, dparams):
  """Exit draft: the target's first `exit_layer` blocks, then one more block whose attention
  output projection is zero (so it is only the adapter's residual SwiGLU MLP, zero-padded to the
  target's MLP width). Returns (blocks, final norm `[D]`, head `[W,D]`)."""
  n = forward.draft.exit_layer
  blocks = [target_params[f'layers_{i}'] for i in range(n)]
  blocks.append(_adapter_block(config, dparams['adapter'], target_params['layers_0']))
  return blocks, dparams['adapter']['final_norm'], dparams['adapter']['head']


def small_blocks(config, target_params, forward, dparams):
  """Small draft: its own blocks, final norm and head (the target's embedding is added by
  `export_hf`). Returns (blocks, final norm `[D]`, head `[W,D]`)."""
  del config, target_params
  n = len(forward.draft.source_layers)
  blocks = [dparams['blocks'][f'layers_{i}'] for i in range(n)]
  return blocks, dparams['blocks']['final_norm']['scale'], dparams['head']


def export_hf(out_dir: str, config, target_params, blocks, final_norm, head, vocab_ids) -> int:
  """Writes `out_dir/model.safetensors` and `config.json` of a `LlamaForCausalLM` with the
  target's input embedding, `blocks`, `final_norm` `[D]` and `head` `[W,D]` placed at the rows
  `vocab_ids` `[W]` of a zero `[V,D]` lm_head. Returns the layer count."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  tensors = {'model.embed_tokens.weight': np.asarray(target_params['embed']['embedding'],
                                                     np.float32),
             'model.norm.weight': np.asarray(final_norm, np.float32)}
  for i, block in enumerate(blocks):
    tensors.update(_block_to_hf(block, i))
  lm_head = np.zeros((config.vocab_size, config.embed_dim), np.float32)
  lm_head[np.asarray(vocab_ids)] = np.asarray(head, np.float32)
  tensors['lm_head.weight'] = lm_head
  os.makedirs(out_dir, exist_ok=True)
  save_file(tensors, os.path.join(out_dir, 'model.safetensors'), metadata={'format': 'pt'})
  hf_config = dict(
      architectures=['LlamaForCausalLM'], model_type='llama', hidden_size=config.embed_dim,
      intermediate_size=config.mlp_dim, num_hidden_layers=len(blocks),
      num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
      head_dim=config.head_dim, rms_norm_eps=config.norm_eps, rope_theta=config.rope_theta,
      vocab_size=config.vocab_size, tie_word_embeddings=False, hidden_act='silu',
      attention_bias=False, mlp_bias=False, max_position_embeddings=8192, bos_token_id=1,
      eos_token_id=2, pad_token_id=2, torch_dtype='float32')
  with open(os.path.join(out_dir, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(hf_config, f, indent=2)
  return len(blocks)
