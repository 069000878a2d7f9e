"""The transformers side of scripts/benchmark.py, run with a python that has transformers and
torch (`.venv-ref/bin/python scripts/hf_peer_bench.py IN.json OUT.json`; it never imports jax).

IN.json: {gguf, prompts: [[token ids]], max_new_tokens, eos_id, hf_drafts: [dirs],
prompt_lookup_ks: [K]}. Greedy only (do_sample=False). Each method runs the first prompt once to
warm up, then every prompt once, batch 1; OUT.json lists {method, k, tokens_per_s, new_tokens,
wall_s, load_s, outputs}.
"""

import json
import os
import sys
import time

import torch
import transformers


def _run(model, prompts, max_new_tokens, eos_id, **kwargs):
  def one(ids):
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id, **kwargs)
    return out[0, len(ids):].tolist()

  one(prompts[0])
  outputs, wall = [], 0.0
  for ids in prompts:
    t0 = time.perf_counter()
    outputs.append(one(ids))
    wall += time.perf_counter() - t0
  n = sum(len(o) for o in outputs)
  return dict(tokens_per_s=n / wall, new_tokens=n, wall_s=wall, outputs=outputs)


def main():
  spec = json.load(open(sys.argv[1], encoding='utf-8'))
  torch.manual_seed(0)
  t0 = time.perf_counter()
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(spec['gguf']), gguf_file=os.path.basename(spec['gguf']),
      torch_dtype=torch.float32)
  model.eval()
  load_s = time.perf_counter() - t0
  args = (model, spec['prompts'], spec['max_new_tokens'], spec['eos_id'])
  results = []
  with torch.inference_mode():
    results.append(dict(method='greedy', load_s=load_s, **_run(*args)))
    print(f"transformers greedy: {results[-1]['tokens_per_s']:.1f} tok/s", flush=True)
    for k in spec['prompt_lookup_ks']:
      results.append(dict(method='prompt_lookup', k=k, **_run(*args, prompt_lookup_num_tokens=k)))
      print(f"transformers prompt lookup K={k}: {results[-1]['tokens_per_s']:.1f} tok/s",
            flush=True)
    for d in spec['hf_drafts']:
      t0 = time.perf_counter()
      assistant = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
      assistant.eval()
      results.append(dict(method=f'assisted:{os.path.basename(d.rstrip("/"))}',
                          load_s=time.perf_counter() - t0, **_run(*args, assistant_model=assistant)))
      print(f"transformers {results[-1]['method']}: {results[-1]['tokens_per_s']:.1f} tok/s",
            flush=True)
  greedy = results[0]['outputs']
  for r in results[1:]:
    r['matches_greedy'] = r['outputs'] == greedy
  with open(sys.argv[2], 'w', encoding='utf-8') as f:
    json.dump(results, f)


if __name__ == '__main__':
  main()
