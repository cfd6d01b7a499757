"""Contract with the pinned verl 0.9.1: every name we import or rely on, with the signature we rely on.

If one of these fails after a verl upgrade, read the upstream change before touching our code.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from importlib.metadata import entry_points, version

import torch
import verl
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils import torch_functional as verl_F

from mrtpo_verl.estimator import compute_mrtpo_outcome_advantage
from mrtpo_verl.math.token_advantage import whiten_with_statistics


def test_pinned_verl_version() -> None:
    assert version("verl") == "0.9.1"


def test_verl_loads_the_verl_plugins_entry_point_group() -> None:
    source = inspect.getsource(verl)
    assert '_entry_points(group="verl.plugins")' in source
    assert "_ep.load()" in source
    names = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert names.get("mrtpo") == "mrtpo_verl.plugin"


def _keys_compute_advantage_passes_to_custom_estimators() -> set[str]:
    """Read the `adv_kwargs` dict literal and every `adv_kwargs[...] =` in verl's compute_advantage."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(compute_advantage)))
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "adv_kwargs" and isinstance(node.value, ast.Dict):
                    keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "adv_kwargs"
                    and isinstance(target.slice, ast.Constant)
                ):
                    keys.add(target.slice.value)
    return keys


def test_our_estimator_accepts_every_kwarg_verl_compute_advantage_passes() -> None:
    passed = _keys_compute_advantage_passes_to_custom_estimators()
    # What verl 0.9.1 passes (the gdpo- and optimal-baseline-only keys included).
    assert {"token_level_rewards", "response_mask", "config", "index", "reward_baselines"} <= passed
    signature = inspect.signature(compute_mrtpo_outcome_advantage)
    signature.bind(**dict.fromkeys(passed))
    named = {p for p in signature.parameters if p != "kwargs"}
    assert {"token_level_rewards", "response_mask", "config", "index", "non_tensor_batch", "batch"} <= named


def test_compute_advantage_signature() -> None:
    params = list(inspect.signature(compute_advantage).parameters)
    assert params == ["data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config"]


def test_compute_advantage_hands_the_batch_only_to_gdpo() -> None:
    """The reason our trainer opens advantage_inputs(...): verl passes non_tensor_batch to 'gdpo' only."""
    source = inspect.getsource(compute_advantage)
    assert 'if adv_estimator in (AdvantageEstimator.GDPO, "gdpo"):' in source
    assert 'adv_kwargs["non_tensor_batch"] = data.non_tensor_batch' in source


def test_registry_functions_and_grpo_helper_signature() -> None:
    assert callable(core_algos.register_adv_est) and callable(core_algos.get_adv_estimator_fn)
    params = list(inspect.signature(core_algos.compute_grpo_outcome_advantage).parameters)
    assert params == ["token_level_rewards", "response_mask", "index", "epsilon", "norm_adv_by_std_in_grpo", "config"]
    assert core_algos.get_adv_estimator_fn("mrtpo") is compute_mrtpo_outcome_advantage


def test_gdpo_reads_its_reward_keys_and_weights_from_algo_config() -> None:
    source = inspect.getsource(core_algos.compute_gdpo_outcome_advantage)
    assert 'config.get("gdpo_reward_keys", None)' in source
    assert 'config.get("gdpo_reward_weights", None)' in source
    assert "verl_F.masked_whiten(new_advantage, response_mask) * response_mask" in source
    fields = AlgoConfig.__dataclass_fields__
    assert "gdpo_reward_keys" in fields and "gdpo_reward_weights" in fields


def test_our_whitening_formula_equals_verls_masked_whiten() -> None:
    """whiten_with_statistics copies masked_whiten's formula (verl 0.9.1); it must stay identical."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        values = torch.randn(8, 13, generator=generator) * 3
        mask = (torch.rand(8, 13, generator=generator) > 0.3).float()
        mean, variance = verl_F.masked_mean(values, mask), verl_F.masked_var(values, mask)
        assert torch.equal(whiten_with_statistics(values, mean, variance), verl_F.masked_whiten(values, mask))


def test_fsdp_engine_details_the_replay_and_the_weight_gather_use() -> None:
    """verl 0.9.1's FSDP engine: the names mrtpo_verl.workers (weight_gather, actor_worker) and the colocated runner
    rely on. A rename upstream would otherwise fall back silently (LoRA) or use no autocast (bf16)."""
    from verl.utils import model as verl_model
    from verl.workers.engine.fsdp import transformer_impl

    engine = transformer_impl.FSDPEngine
    source = inspect.getsource(transformer_impl)
    assert "self._autocast_dtype = param_dtype" in source, "actor_worker reads FSDPEngine._autocast_dtype"
    assert "self._qat_enabled =" in source, "weight_gather routes QAT through verl's export"
    for name in ("get_per_tensor_param", "_merged_lora_per_tensor_param"):
        assert callable(getattr(engine, name, None)), f"weight_gather._verl_export calls FSDPEngine.{name}"
    assert callable(verl_model.convert_weight_keys), "weight_gather names tensors with verl's convert_weight_keys"


def test_validate_config_still_asserts_the_texts_cli_errors_maps_to_fields() -> None:
    from verl.utils import config as verl_config

    from mrtpo_verl.cli_errors import VERL_CHECK_FIELDS

    source = inspect.getsource(verl_config.validate_config)
    for text in VERL_CHECK_FIELDS:
        assert text in source, f"cli_errors.VERL_CHECK_FIELDS: verl's validate_config no longer says {text!r}"
