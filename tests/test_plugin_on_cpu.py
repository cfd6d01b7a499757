"""The `verl.plugins` entry point registers `mrtpo` in every process, and a broken install is loud."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LOOKUP = "import verl; from verl.trainer.ppo.core_algos import get_adv_estimator_fn; fn = get_adv_estimator_fn('mrtpo')"


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter of this venv that has not imported mrtpo_verl itself."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_fresh_interpreter_finds_mrtpo_through_the_entry_point() -> None:
    result = run_python(
        "import sys\n" + LOOKUP + "\nprint(fn.__module__, fn.__name__)\nassert 'mrtpo_verl.estimator' in sys.modules"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["mrtpo_verl.estimator", "compute_mrtpo_outcome_advantage"]


def test_plugins_disabled_means_no_mrtpo() -> None:
    """Control for the test above: the look-up really depends on verl loading our entry point."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    result = subprocess.run([sys.executable, "-c", LOOKUP], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode != 0
    assert "Unknown advantage estimator simply: mrtpo" in result.stderr


def test_import_verl_alone_loads_neither_our_estimator_nor_verls_trainer_stack() -> None:
    """A process that only imports verl (a rollout server, a reward worker) pays nothing for the plugin;
    the registrations happen when verl's registry modules are imported, and only then."""
    result = run_python(
        textwrap.dedent(
            """
            import sys
            import verl
            print(sorted(m for m in sys.modules if m.startswith("mrtpo_verl")))
            print("verl.trainer.ppo.core_algos" in sys.modules, "verl.trainer.ppo.v1.trainer_base" in sys.modules)
            from verl.trainer.ppo.v1.trainer_base import get_trainer_cls
            print(get_trainer_cls("mrtpo_separate_async").__module__)
            from verl.trainer.ppo.core_algos import get_adv_estimator_fn
            print(get_adv_estimator_fn("mrtpo").__module__)
            """
        )
    )
    assert result.returncode == 0, result.stderr
    loaded, registries, trainer, estimator = result.stdout.splitlines()[-4:]
    assert loaded == "['mrtpo_verl', 'mrtpo_verl.compat', 'mrtpo_verl.compat.verl_registries', 'mrtpo_verl.plugin']"
    assert registries == "False False"
    assert (trainer, estimator) == ("mrtpo_verl.trainer.mrtpo_trainer", "mrtpo_verl.estimator")


def test_broken_install_fails_loudly() -> None:
    """Simulate a broken install: a module our estimator imports cannot be imported.

    verl 0.9.1 would log the failure at debug level and go on; our plugin logs it at ERROR with the
    traceback, and asking for `mrtpo` raises with the original cause instead of "Unknown estimator".
    """
    code = (
        textwrap.dedent(
            """
        import sys
        sys.modules["mrtpo_verl.math.token_weights"] = None  # makes `import` of it raise ImportError
        """
        )
        + LOOKUP
        + textwrap.dedent(
            """
        try:
            fn(token_level_rewards=None, response_mask=None, config=None)
        except Exception as error:
            print(type(error).__name__)
            print(error)
        """
        )
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "mrtpo-verl plugin failed to load" in result.stderr
    assert "mrtpo_verl.math.token_weights" in result.stderr
    assert result.stdout.startswith("MRTPOPluginLoadError")
    assert "could not be loaded" in result.stdout and "ModuleNotFoundError" in result.stdout


def test_a_trainer_that_cannot_be_imported_is_logged_when_verls_trainer_registry_loads() -> None:
    """The trainers register when verl's trainer registry module is imported; a failure there is logged at ERROR
    with its cause (verl's own look-up then names the modes it has)."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["mrtpo_verl.trainer.advantage_step"] = None  # makes `import` of it raise ImportError
        import verl
        from verl.trainer.ppo.v1 import trainer_base
        print(sorted(name for name in trainer_base.TRAINER_REGISTRY if name.startswith("mrtpo_")))
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "mrtpo-verl plugin failed to load" in result.stderr
    assert "mrtpo_verl.trainer.advantage_step" in result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


@pytest.mark.slow
def test_ray_actor_finds_mrtpo() -> None:
    """A Ray worker process imports verl on its own; the entry point registers mrtpo there too."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="mrtpo-plugin-test")
    try:

        @ray.remote(num_cpus=1)
        class Lookup:
            def estimator_module(self) -> tuple[str, bool]:
                # Check the driver's import did not leak: a fresh worker process has its own modules.
                import sys

                before = "mrtpo_verl.estimator" in sys.modules
                import verl  # noqa: F401
                from verl.trainer.ppo.core_algos import get_adv_estimator_fn

                return get_adv_estimator_fn("mrtpo").__module__, before

        actor = Lookup.remote()  # type: ignore[attr-defined]
        module, imported_before = ray.get(actor.estimator_module.remote(), timeout=240)
        assert module == "mrtpo_verl.estimator"
        assert imported_before is False
    finally:
        ray.shutdown()
