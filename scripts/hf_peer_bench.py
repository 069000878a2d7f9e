"""The transformers side of scripts/benchmark.py, run with a python that has transformers and
torch (`.venv-ref/bin/python scripts/hf_peer_bench.py --spec IN.json --out OUT.json`; it never
imports jax, and imports torch only once it runs, so `--help` works without it).

IN.json: {gguf, prompts: [[token ids]], max_new_tokens, eos_id, hf_drafts: [dirs],
prompt_lookup_ks: [K]}. Greedy only (do_sample=False). Each method runs the first prompt once to
warm up, then every prompt once, batch 1; OUT.json lists {method, k, tokens_per_s, new_tokens,
wall_s, load_s, outputs}.
"""

import argparse
import json
import os
import time


def _run(torch, model, prompts, max_new_tokens, eos_id, **kwargs):
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


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--spec', required=True, help='IN.json, written by scripts/benchmark.py')
  p.add_argument('--out', required=True, help='OUT.json to write')
  args = p.parse_args(argv)
  with open(args.spec, encoding='utf-8') as f:
    spec = json.load(f)
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit(f'{e}: this script needs `pip install -e ".[peers]"` (transformers, '
                     'accelerate, torch) in the python that runs it') from None
  torch.manual_seed(0)
  t0 = time.perf_counter()
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(spec['gguf']), gguf_file=os.path.basename(spec['gguf']),
      torch_dtype=torch.float32)
  model.eval()
  load_s = time.perf_counter() - t0
  run_args = (torch, model, spec['prompts'], spec['max_new_tokens'], spec['eos_id'])
  results = []
  with torch.inference_mode():
    results.append(dict(method='greedy', load_s=load_s, **_run(*run_args)))
    print(f"transformers greedy: {results[-1]['tokens_per_s']:.1f} tok/s", flush=True)
    for k in spec['prompt_lookup_ks']:
      results.append(dict(method='prompt_lookup', k=k,
                          **_run(*run_args, prompt_lookup_num_tokens=k)))
      print(f"transformers prompt lookup K={k}: {results[-1]['tokens_per_s']:.1f} tok/s",
            flush=True)
    for d in spec['hf_drafts']:
      t0 = time.perf_counter()
      assistant = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
      assistant.eval()
      results.append(dict(method=f'assisted:{os.path.basename(d.rstrip("/"))}',
                          load_s=time.perf_counter() - t0,
                          **_run(*run_args, assistant_model=assistant)))
      print(f"transformers {results[-1]['method']}: {results[-1]['tokens_per_s']:.1f} tok/s",
            flush=True)
  greedy = results[0]['outputs']
  for r in results[1:]:
    r['matches_greedy'] = r['outputs'] == greedy
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump(results, f)


if __name__ == '__main__':
  main()
