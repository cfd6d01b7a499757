"""The CPU demo: one MRTPO credit-assignment step on real prompts with the embedded SmolLM2.

Run ``python -m mrtpo_verl.demo --help``.
"""
