"""mrtpo-verl: MRTPO (Multi-Reward-to-Token Policy Optimization) as a plugin for verl 0.9.1."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

setup(
    name="mrtpo-verl",
    version="0.1.0",
    description="Reward-specific token-level credit assignment (MRTPO) for multi-reward RL in verl",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["mrtpo_verl", "mrtpo_verl.*", "reward_fns", "reward_fns.*"]),
    include_package_data=True,
    package_data={
        "mrtpo_verl": ["configs/*.yaml"],
        "reward_fns": ["data/**/*"],
    },
    # Nothing here moves a package of a verl[vllm]==0.9.1 environment (scripts/install_check.py, whose result
    # tests/test_install_check_on_cpu.py holds this list to). torch: the minor versions the seams to torch are
    # written for (mrtpo_verl.compat.torch_fsdp.TESTED_TORCH); install your CUDA (or the CPU) build first.
    install_requires=[
        "verl[verl-core]==0.9.1",
        "torch>=2.6,<2.14",
        "numpy",
        "omegaconf",
        "hydra-core",
        "transformers",
        "gguf",
        "rich",
        "scipy",
        # text-to-SQL verifier
        "sqlglot",
        # instruction-following checker libraries (IFEval, IFBench) import these
        "nltk",
        "langdetect",
        "immutabledict",
        "emoji",
        "syllapy",
        "absl-py",
        # the plugin's post-import hooks (verl's own resolution already holds it)
        "wrapt",
        # the lock of the embedded model's conversion cache (verl's own resolution already holds it)
        "filelock",
    ],
    extras_require={
        # matplotlib: the plots of python -m benchmarks.learning (its smoke test runs in make test)
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "scipy", "ruff", "mypy", "matplotlib"],
    },
    entry_points={
        # Loaded by every `import verl` (driver and Ray workers): registers adv_estimator=mrtpo.
        "verl.plugins": ["mrtpo = mrtpo_verl.plugin"],
    },
)
