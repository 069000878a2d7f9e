"""Why verifying K+1 tokens costs more than one token on XLA:CPU: the matmuls alone.

Times (best of --repeats, 30) SmolLM2's 30 MLP weight pairs (576x1536, 1536x576, fp32, random)
applied to T = 1..8 rows (--widths) in three formulations, and the C++ kernel's where it is built,
in one run, and prints ms and the ratio to T=1 side by side:

- `x @ W`, W stored (in, out): XLA's dot, what models/llama.py runs outside the kernel's rows;
- `x @ W.T`, W stored (out, in): the fastest here for T = 1;
- `(W @ x.T).T`, W stored (out, in), with optimization barriers so XLA keeps the weight as the
  left operand: the flattest in T here.
- `tile x @ W`: `models.cpu_matmul.kernel_matmul`, the kernel's tile form (one fma chain over k
  per output), what the model takes for `STREAM_MAX_ROWS` + 1 to `MAX_ROWS` rows;
- `model x @ W`: `models.cpu_matmul.matmul`, what the model takes (the streaming form up to
  `STREAM_MAX_ROWS` rows, then the tile form; docs/cpu_verify.md).

Then the tied head (SmolLM2's embedding [V, D] = [49152, 576], 113 MB, read (out, in)) at the
same T, in the forms `models.cpu_matmul.matmul_nt` chooses between:

- `x @ E.T`: XLA's dot contracting E's last axis (what the model takes at one row);
- `einsum N-leading`: XLA's `einsum('NK,TK->NT')` moved back (the model's XLA path);
- `tile NK`: the kernel's tile form (8 lane-wise chains; the invariant mode's);
- `stream NK`: the kernel's streaming form (16 lane-wise chains, rows of E in order; what the
  model takes for 2 to `STREAM_MAX_ROWS` rows).

  .venv/bin/python scripts/bench_matmul_layouts.py [--repeats 30] [--widths 1,2,3,4,5,8]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxspec.bench import timed  # pylint: disable=g-import-not-at-top,wrong-import-position
from models import cli, cpu_matmul  # pylint: disable=g-import-not-at-top,wrong-import-position

D, F, LAYERS = 576, 1536, 30


def _mlp(dense):
  def run(x, ups, downs):
    for up, down in zip(ups, downs):
      x = x + dense(jnp.tanh(dense(x, up)), down)
    return x
  return jax.jit(run)


def _weight_left(x, w):
  barrier = jax.lax.optimization_barrier
  return barrier(w @ barrier(x.T)).T


FORMS = {
    'x@W (in,out)': (_mlp(lambda x, w: x @ w), False),
    'x@W.T (out,in)': (_mlp(lambda x, w: x @ w.T), True),
    '(W@x.T).T (out,in)': (_mlp(_weight_left), True),
}
if cpu_matmul.available():  # the C++ kernel's two forms
  FORMS['tile x@W (in,out)'] = (_mlp(cpu_matmul.kernel_matmul), False)
  FORMS['model x@W (in,out)'] = (_mlp(cpu_matmul.matmul), False)

V = 49152
HEAD_FORMS = {
    'x@E.T': jax.jit(lambda x, e: jax.lax.dot_general(x, e, (((1,), (1,)), ((), ())))),
    'einsum N-leading': jax.jit(lambda x, e: jnp.einsum('NK,TK->NT', e, x).T),
}
if cpu_matmul.available():
  HEAD_FORMS['tile NK'] = jax.jit(cpu_matmul._small_rows_nk)  # pylint: disable=protected-access
  HEAD_FORMS['stream NK'] = jax.jit(cpu_matmul._streamed_nk)  # pylint: disable=protected-access


def _table(title, forms, widths, run):
  """Prints ms (ratio to the first T) for each form and width; run(form, t) -> ms."""
  print(title)
  print('T  ' + ''.join(f'{name:>26}' for name in forms))
  base = {}
  for t in widths:
    cells = []
    for name, form in forms.items():
      ms = run(form, t)
      base.setdefault(name, ms)
      cells.append(f'{ms:8.1f} ({ms / base[name]:.2f}x)')
    print(f'{t:<3}' + ''.join(f'{c:>26}' for c in cells), flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--repeats', type=cli.positive_int, default=30, help='timed calls (best kept)')
  p.add_argument('--widths', type=cli.list_of(cli.positive_int), default='1,2,3,4,5,8',
                 help='T values (rows), comma-separated')
  args = p.parse_args(argv)
  keys = jax.random.split(jax.random.key(0), 2 * LAYERS)
  ups = [0.02 * jax.random.normal(keys[i], (D, F)) for i in range(LAYERS)]
  downs = [0.02 * jax.random.normal(keys[LAYERS + i], (F, D)) for i in range(LAYERS)]
  ups_t, downs_t = [w.T.copy() for w in ups], [w.T.copy() for w in downs]
  print(f'jax {jax.__version__}, {jax.devices()[0].platform}; best ms of {args.repeats} calls '
        '(ratio to T=1)')
  weights = {False: (ups, downs), True: (ups_t, downs_t)}
  _table('30 MLP pairs', FORMS, args.widths, lambda form, t: 1e3 * timed(
      form[0], jnp.ones((t, D)), *weights[form[1]], reps=args.repeats))
  emb = 0.02 * jax.random.normal(jax.random.key(1), (V, D))
  _table(f'tied head [{V}, {D}]', HEAD_FORMS, args.widths, lambda form, t: 1e3 * timed(
      form, jnp.ones((t, D)), emb, reps=args.repeats))


if __name__ == '__main__':
  main()
