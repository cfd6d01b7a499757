"""``python -m mrtpo_verl.credit.render``: the token-credit page for steps of a real run.

A training run with ``mrtpo.dump_dir=DIR`` writes ``DIR/step_<N>.jsonl`` (see
:mod:`mrtpo_verl.trainer.credit_dump`); the demo writes ``views.jsonl``. This renders chosen
steps into one self-contained HTML page::

    python -m mrtpo_verl.credit.render DIR --steps 10 20 --out credit.html

``python -m mrtpo_verl.demo.render`` is the same command under its first name.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from mrtpo_verl.credit.html_page import render_page
from mrtpo_verl.credit.views import read_views

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


def available_steps(directory: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in directory.glob("step_*.jsonl") if (m := _STEP_FILE.search(p.name))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mrtpo_verl.credit.render",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", type=Path, help="a dump directory (step_<N>.jsonl files) or one .jsonl file")
    parser.add_argument("--steps", type=int, nargs="*", default=None, help="steps to show (default: the last)")
    parser.add_argument("--out", type=Path, default=Path("token_credit.html"))
    args = parser.parse_args(argv)
    if args.source.is_file():
        files = {0: args.source}
        chosen = [0]
    elif args.source.is_dir():
        files = available_steps(args.source)
        if not files:
            parser.error(f"{args.source}: no step_<N>.jsonl files (was the run started with mrtpo.dump_dir?)")
        chosen = args.steps or [max(files)]
        missing = [s for s in chosen if s not in files]
        if missing:
            parser.error(f"steps {missing} not in {args.source}; available: {sorted(files)}")
    else:
        parser.error(f"{args.source} does not exist")
    views, reward_keys, meta = [], [], {}
    for step in chosen:
        meta, step_views = read_views(files[step])
        for view in step_views:
            view.group = f"step {meta.get('step', step)} · {view.group}"
            reward_keys += [k for k in view.gdpo_by_reward if k not in reward_keys]
        views += step_views
    meta = {**meta, "steps": ", ".join(map(str, chosen))}
    args.out.write_text(render_page("MRTPO vs GDPO token credit", views, reward_keys, meta), encoding="utf-8")
    print(f"wrote {args.out} ({len(views)} responses from steps {chosen})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
