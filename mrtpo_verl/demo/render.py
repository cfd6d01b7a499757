"""``python -m mrtpo_verl.demo.render``: an alias of ``python -m mrtpo_verl.credit.render``.

The render CLI draws the token-credit page for a run's ``mrtpo.dump_dir`` as well as for the demo's
``views.jsonl``, so it lives with the credit code; this name keeps working.
"""

from __future__ import annotations

from mrtpo_verl.credit.render import available_steps, main

__all__ = ["available_steps", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
