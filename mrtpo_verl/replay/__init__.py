"""The leave-one-out replay: per-token relevance of each reward's verifier information.

- :mod:`.model_loading`: load a local causal LM (or the embedded SmolLM2-135M-Instruct) offline.
- :mod:`.contexts`: render the full and leave-one-out replay contexts (token ids) of each response.
- :mod:`.scorer`: batched prefill passes over those contexts → relevance ``q`` (bs, K, L).
"""
