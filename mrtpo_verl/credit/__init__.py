"""Token credit: where each reward's advantage lands on a response's tokens, under GDPO and MRTPO.

Used by the trainer (``mrtpo.dump_dir``), the demo and the render CLI; it imports neither of them.

- :mod:`~mrtpo_verl.credit.token_credit`: the per-token, per-reward credit of a replayed batch;
- :mod:`~mrtpo_verl.credit.views`: one JSON-friendly view per response, and the dump file format;
- :mod:`~mrtpo_verl.credit.html_page`: the self-contained page that shades each token by its credit;
- :mod:`~mrtpo_verl.credit.render`: ``python -m mrtpo_verl.credit.render``, the page for steps of a run.
"""
