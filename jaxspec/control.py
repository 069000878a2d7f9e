"""Control flow for state updated in place."""

from __future__ import annotations

from typing import Any, Callable

import jax


def run_if(pred: jax.Array, fn: Callable[[Any], Any], state: Any) -> Any:
  """`fn(state)` if `pred` (a scalar bool) else `state`, as a while loop of 0 or 1 trips.

  The same result as `lax.cond(pred, fn, lambda s: s, state)`, but XLA:CPU copies every buffer
  that a `conditional`'s branch updates in place (for a KV cache, the whole cache each call),
  while a loop's carry is updated in place. `fn` must return a pytree of `state`'s structure,
  shapes and dtypes.
  """
  return jax.lax.while_loop(lambda c: c[0], lambda c: (False, fn(c[1])), (pred, state))[1]
