"""Contract with the installed dependencies: every seam function of ``mrtpo_verl.compat``, and the public names used.

Each test of a seam function is marked ``@covers("<module>.<name>")``; its failure reads
``seam mrtpo_verl.compat.<module>.<name> broke: ...``, and that function's docstring says what it relies
on. :func:`test_every_seam_function_is_covered` fails when a seam function has no test here, and
:func:`test_no_private_detail_outside_the_seam` when a module outside ``compat`` reaches a private name.
After a verl (or transformers, Ray, omegaconf, TransferQueue) upgrade, run this file first.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import inspect
import os
import pkgutil
import textwrap
from collections import defaultdict
from collections.abc import Callable
from importlib.metadata import entry_points, version
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
import verl
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils import torch_functional as verl_F

import mrtpo_verl.compat
from mrtpo_verl.estimator import compute_mrtpo_outcome_advantage
from mrtpo_verl.math.token_advantage import whiten_with_statistics

REPO = Path(__file__).resolve().parents[1]
#: seam name ("verl.finish_advantage_as_verl") → the tests that exercise it.
COVERED: dict[str, list[str]] = defaultdict(list)


def covers(*seams: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test as the check of ``seams``; its failure names them."""

    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        for name in seams:
            COVERED[name].append(test.__name__)

        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return test(*args, **kwargs)
            except Exception as error:
                named = ", ".join(f"mrtpo_verl.compat.{name}" for name in seams)
                raise AssertionError(
                    f"seam {named} broke: {error}. Re-read what its docstring says it relies on"
                ) from error

        return run

    return mark


def _seam_modules() -> list[Any]:
    return [
        importlib.import_module(f"mrtpo_verl.compat.{info.name}")
        for info in pkgutil.iter_modules(mrtpo_verl.compat.__path__)
    ]


def test_every_seam_function_is_covered() -> None:
    names = {f"{module.__name__.rsplit('.', 1)[1]}.{name}" for module in _seam_modules() for name in module.__all__}
    missing = sorted(names - set(COVERED) - {"transfer_queue.KVBatchMeta"})
    assert not missing, f"seam functions without a contract test here: {missing}"


def test_no_private_detail_outside_the_seam() -> None:
    """No module of mrtpo_verl outside compat, nor of the CPU backend (mrtpo_cpu), reads another object's private
    attribute or imports a private name, TransferQueue or transformers' cache classes."""
    allowed_dunders = {
        "__name__",
        "__dict__",
        "__class__",
        "__cause__",
        "__file__",
        "__doc__",
        "__module__",
        "__matmul__",
        "__version__",  # a package's public version string
    }
    found = []
    for path in sorted([*(REPO / "mrtpo_verl").rglob("*.py"), *(REPO / "mrtpo_cpu").rglob("*.py")]):
        if "compat" in path.parts:
            continue
        where = path.relative_to(REPO)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and node.attr not in allowed_dunders:
                base = node.value
                own = isinstance(base, ast.Name) and base.id in ("self", "cls")
                parent = isinstance(base, ast.Call) and getattr(base.func, "id", None) == "super"
                if not own and not parent:
                    found.append(f"{where}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [alias.name for alias in node.names]
                if node.module.split(".")[0] == "transfer_queue" or node.module == "transformers.cache_utils":
                    found.append(f"{where}:{node.lineno} from {node.module} import ...")
                found += [f"{where}:{node.lineno} import {node.module}.{n}" for n in names if n.startswith("_")]
            if isinstance(node, ast.Import):
                found += [
                    f"{where}:{node.lineno} import {a.name}" for a in node.names if a.name.startswith("transfer_queue")
                ]
    assert not found, "private details outside mrtpo_verl.compat (add a seam function instead): " + "; ".join(found)


# --- compat.verl: the v1 trainer -------------------------------------------------------------------------------

#: sha256 of verl 0.9.1's PPOTrainer._compute_advantage, which finish_advantage_as_verl follows line by line.
VERL_COMPUTE_ADVANTAGE_SHA256 = "2a4a2aa4a475b228d401959818e0b9019276ce27961c133961de217baa387da7"
#: sha256 of verl 0.9.1's PPOTrainerSeparateAsync._compute_old_log_prob, whose π_old swap pi_old_weights repeats.
VERL_SEPARATE_OLD_LOG_PROB_SHA256 = "eff91c009b2767d2609ecc1b7121489d9ea4ec9482de71c9f3431f1afa4f6c4c"


@covers("verl.finish_advantage_as_verl", "verl.VERL_ADVANTAGE_FIELDS", "verl.rollout_bypass_mode")
def test_verls_advantage_step_is_the_one_we_follow() -> None:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from mrtpo_verl.compat.verl import VERL_ADVANTAGE_FIELDS

    source = inspect.getsource(PPOTrainer._compute_advantage)
    assert hashlib.sha256(source.encode()).hexdigest() == VERL_COMPUTE_ADVANTAGE_SHA256, (
        "verl's PPOTrainer._compute_advantage changed"
    )
    listed = source[source.index("fields = [") + len("fields = ") :].split("]", 1)[0] + "]"
    assert tuple(ast.literal_eval(listed)) == VERL_ADVANTAGE_FIELDS
    assert 'rollout_corr_config.get("bypass_mode", False)' in source


def _run_config(estimator: str) -> Any:
    with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
        return compose(
            config_name="mrtpo_trainer",
            overrides=[f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=2"],
        )


@pytest.fixture(scope="module")
def transfer_queue() -> Any:
    import transfer_queue as tq

    config = OmegaConf.to_container(_run_config("grpo").transfer_queue, resolve=True)
    config.update(enable=True)
    config["backend"]["SimpleStorage"].update(num_data_storage_units=1, total_storage_size=1000)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:  # Ray goes down even when TransferQueue cannot start, so later modules can start their own
        tq.init(OmegaConf.create(config))
        try:
            yield tq
        finally:
            tq.close()
    finally:
        ray.shutdown()


def _put_batch(tq: Any, partition: str) -> Any:
    """Four rows (two prompts × two sessions) as verl's agent loop and reward stage leave them."""
    from verl.utils import tensordict_utils as tu

    generator = torch.Generator().manual_seed(0)
    prompt_lengths, response_lengths = [3, 5, 3, 5], [4, 2, 6, 3]

    def nested(rows: list[torch.Tensor]) -> Any:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    rm_scores = []
    for length in response_lengths:
        row = torch.zeros(length)
        row[-1] = float(torch.rand((), generator=generator))
        rm_scores.append(row)
    uids = np.array(["p0", "p1", "p0", "p1"], dtype=object)
    extra = np.empty(4, dtype=object)
    extra[:] = [{"reward_extra_info": {"r0": float(i), "info": f"row {i}"}} for i in range(4)]
    fields = {
        "prompts": nested([torch.randint(0, 100, (n,), generator=generator) for n in prompt_lengths]),
        "responses": nested([torch.randint(0, 100, (n,), generator=generator) for n in response_lengths]),
        "response_mask": nested([torch.ones(n, dtype=torch.long) for n in response_lengths]),
        "rm_scores": nested(rm_scores),
        "uid": uids,
        "extra_fields": extra,
    }
    keys = ["p0_0_0", "p1_0_0", "p0_1_0", "p1_1_0"]
    tags = [{"status": "success"}, {"status": "success"}, {"status": "success"}, {"status": "success", "is_padding": 0}]
    return tq.kv_batch_put(keys=keys, partition_id=partition, fields=tu.get_tensordict(fields), tags=tags)


def _bare_trainer(estimator: str) -> Any:
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    trainer = object.__new__(PPOTrainerSync)
    trainer.config = _run_config(estimator)
    trainer.global_steps = 1
    return trainer


@covers(
    "verl.finish_advantage_as_verl",
    "transfer_queue.read_fields",
    "transfer_queue.write_fields",
    "transfer_queue.object_column",
    "transfer_queue.prompt_lengths",
)
def test_our_advantage_path_gives_verls_advantages(transfer_queue: Any) -> None:
    """grpo through verl's own step and through read_fields + finish_advantage_as_verl: the same advantages."""
    from verl.protocol import DataProto

    from mrtpo_verl.compat import transfer_queue as tq_batch
    from mrtpo_verl.compat.verl import VERL_ADVANTAGE_FIELDS, finish_advantage_as_verl

    tq = transfer_queue
    theirs = _bare_trainer("grpo")._compute_advantage(_put_batch(tq, "verl"), {})
    expected = tq.kv_batch_get(keys=theirs.keys, partition_id="verl", select_fields=["advantages"])

    batch = _put_batch(tq, "ours")
    data = tq_batch.read_fields(batch, [f for f in VERL_ADVANTAGE_FIELDS if f in ("uid", "response_mask", "rm_scores")])
    response_mask = data["response_mask"]
    uid = tq_batch.object_column(data.pop("uid"))
    filled = DataProto(batch=data.to_padded_tensor(), non_tensor_batch={"uid": uid})
    filled.batch["token_level_scores"] = filled.batch["rm_scores"]
    opened = []
    finish_advantage_as_verl(
        _bare_trainer("grpo"), filled, batch, response_mask, {}, lambda d: contextlib.nullcontext(opened.append(d))
    )
    got = tq.kv_batch_get(keys=batch.keys, partition_id="ours", select_fields=["advantages"])
    assert len(opened) == 1
    assert torch.equal(got["advantages"].to_padded_tensor(0.0), expected["advantages"].to_padded_tensor(0.0))
    assert tq_batch.prompt_lengths(tq_batch.read_fields(batch, ["prompts"])).tolist() == [3, 5, 3, 5]


@covers(
    "transfer_queue.response_lengths",
    "transfer_queue.rollout_attention_mask",
    "transfer_queue.stored_response_ids",
    "transfer_queue.tagged_response_lengths",
)
def test_the_rollout_layout_reads_back_from_lengths(transfer_queue: Any) -> None:
    """Stored responses are unpadded rows; the mask over [prompts | responses] is verl's, built from the lengths."""
    from mrtpo_verl.compat import transfer_queue as tq_batch

    batch = _put_batch(transfer_queue, "layout")
    data = tq_batch.read_fields(batch, ["prompts", "responses"])
    lengths = tq_batch.prompt_lengths(data), tq_batch.response_lengths(data)
    assert lengths[1].tolist() == [4, 2, 6, 3]
    stored = tq_batch.stored_response_ids(data)
    padded = data["responses"].to_padded_tensor(-1)
    assert [row.tolist() for row in stored] == [padded[i, :n].tolist() for i, n in enumerate([4, 2, 6, 3])]
    mask = tq_batch.rollout_attention_mask(*lengths, 5, 6)
    expected = torch.zeros(4, 11, dtype=torch.int64)
    for row, (p, r) in enumerate(zip([3, 5, 3, 5], [4, 2, 6, 3], strict=True)):
        expected[row, :p] = expected[row, 5 : 5 + r] = 1
    assert mask.dtype == torch.int64 and torch.equal(mask, expected)
    tags = [{"response_len": 4}, {"status": "success"}]
    assert tq_batch.tagged_response_lengths(tq_batch.KVBatchMeta(keys=["a_0_0", "b_0_0"], tags=tags)) == [4, None]


@covers(
    "transfer_queue.available_fields",
    "transfer_queue.pop_reward_output",
    "transfer_queue.float_column",
    "transfer_queue.batch_tags",
    "transfer_queue.is_padding_row",
)
def test_reward_outputs_and_tags_read_back(transfer_queue: Any) -> None:
    from mrtpo_verl.compat import transfer_queue as tq_batch

    batch = _put_batch(transfer_queue, "extra")
    first = tq_batch.read_fields(batch, rows=1)
    assert {"r0", "info", "rm_scores", "extra_fields"} <= tq_batch.available_fields(first)
    data = tq_batch.read_fields(batch, ["extra_fields"])
    extra = tq_batch.object_column(data.pop("extra_fields"))
    assert tq_batch.float_column(tq_batch.pop_reward_output(data, extra, "r0"), "r0").tolist() == [0, 1, 2, 3]
    assert list(tq_batch.pop_reward_output(data, extra, "info")) == [f"row {i}" for i in range(4)]
    with pytest.raises(KeyError, match="no reward output 'absent'"):
        tq_batch.pop_reward_output(data, extra, "absent")
    with pytest.raises(ValueError, match="'info' holds non-numeric"):
        tq_batch.float_column(["row 0"], "info")
    tags = tq_batch.batch_tags(batch)
    assert [t["status"] for t in tags] == ["success"] * 4
    assert [tq_batch.is_padding_row(t) for t in tags] == [False] * 4
    assert tq_batch.is_padding_row({"is_padding": True})


@covers("transfer_queue.row_key_parts", "transfer_queue.is_padding_row")
def test_verls_row_keys_and_padding_tag() -> None:
    from verl.trainer.ppo import padding_utils
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from mrtpo_verl.compat.transfer_queue import row_key_parts

    assert 'keys.append(f"{uid}_{session_id}_{i}")' in inspect.getsource(agent_loop_tq)
    assert 'uid = key.split("_")[0]' in inspect.getsource(ReplayBuffer._materialize_batch)
    assert "is_padding=True," in inspect.getsource(padding_utils)
    assert row_key_parts("a_b_uid_3_0") == ("a_b_uid", 3)
    with pytest.raises(ValueError, match="is not verl's"):
        row_key_parts("uid_x_0")


@covers("verl.VerlTrainerSeam")
def test_the_v1_trainer_calls_the_hooks_the_seam_overrides() -> None:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from mrtpo_verl.trainer.mrtpo_trainer import TRAINER_CLASSES

    source = inspect.getsource(PPOTrainer)
    assert "self.trainer_mode = self.config.trainer.v1.trainer_mode" in source
    assert 'ReplayBuffer if self.trainer_mode == "sync" else ReplayBufferAsync' in source
    assert 'self.config.trainer.v1.get(self.trainer_mode, {}).get("parameter_sync_step", 1)' in source
    assert "self._init_resource_pool_mgr()" in source and "self._compute_advantage(" in source
    for cls in TRAINER_CLASSES.values():
        trainer = object.__new__(cls)
        trainer.trainer_mode = "mrtpo_x"
        assert (trainer.trainer_mode, trainer.registered_mode) == (cls.verl_mode, "mrtpo_x")


@covers("verl.replace_actor_worker_classes", "ray.remote_class")
def test_worker_classes_are_replaced_in_verls_mapping() -> None:
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from mrtpo_verl.compat.ray import remote_class
    from mrtpo_verl.compat.verl import replace_actor_worker_classes

    assert "self.role_worker_mapping[role] = ray.remote(ActorRolloutRefWorker)" in inspect.getsource(trainer_base)

    class Ours(ActorRolloutRefWorker):
        pass

    holder = type("Trainer", (), {})()
    holder.role_worker_mapping = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker), Role.Critic: object}
    replace_actor_worker_classes(holder, lambda cls: Ours if cls is ActorRolloutRefWorker else None)
    assert remote_class(holder.role_worker_mapping[Role.ActorRollout]) is Ours
    assert holder.role_worker_mapping[Role.Critic] is object
    assert remote_class(object) is None


@covers("verl.pi_old_weights")
def test_separate_async_parks_pi_old_as_we_do() -> None:
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    source = inspect.getsource(PPOTrainerSeparateAsync._compute_old_log_prob)
    assert hashlib.sha256(source.encode()).hexdigest() == VERL_SEPARATE_OLD_LOG_PROB_SHA256, (
        "verl's separate_async old-log-prob weight swap changed"
    )
    for name in ("save_model_to_cpu", "restore_model_from_cpu", "clear_cpu_model"):
        assert callable(getattr(DetachActorWorker, name)), name
    assert "local_trigger_step" in inspect.getsource(PPOTrainerSeparateAsync)


# --- compat.verl: the FSDP actor engine ------------------------------------------------------------------------


@covers(
    "verl.actor_engine",
    "verl.engine_module",
    "verl.engine_autocast_dtype",
    "verl.engine_reshard_after_forward",
    "verl.engine_ulysses_size",
    "verl.engine_tokenizer",
    "verl.is_lora_or_qat",
    "verl.engine_full_weights",
    "verl.hf_state_dict",
)
def test_fsdp_engine_attributes_the_seam_reads() -> None:
    from verl.utils import model as verl_model
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.engine_workers import ActorRolloutRefWorker

    engine = transformer_impl.FSDPEngine
    source = inspect.getsource(transformer_impl)
    for text in (
        "self._autocast_dtype = param_dtype",
        "self._qat_enabled =",
        "self.module = module",
        "self.engine_config = engine_config",
        "self.model_config = model_config",
        "self.ulysses_sequence_parallel_size = self.engine_config.ulysses_sequence_parallel_size",
    ):
        assert text in source, text
    for name in ("get_per_tensor_param", "_merged_lora_per_tensor_param", "eval_mode", "is_mp_src_rank_with_outputs"):
        assert callable(getattr(engine, name, None)), f"FSDPEngine.{name}"
    workers = inspect.getsource(importlib.import_module("verl.workers.engine_workers"))
    assert "self.actor = self.actor_worker_cls(" in inspect.getsource(ActorRolloutRefWorker)
    assert "actor_worker_cls = TrainingWorker" in workers and "self.engine: BaseEngine = EngineRegistry.new(" in workers
    assert callable(verl_model.convert_weight_keys)
    from verl.workers.config.engine import FSDPEngineConfig

    assert "reshard_after_forward" in FSDPEngineConfig.__dataclass_fields__


@covers("verl.engine_device")
def test_engine_device_is_verls_platform_device() -> None:
    """Under our CPU platform (as in every CPU test's workers) verl's device helpers answer cpu."""
    import subprocess
    import sys

    assert "get_device_id()" in inspect.getsource(importlib.import_module("verl.workers.engine.fsdp.transformer_impl"))
    probe = "\n".join(
        (
            "import mrtpo_cpu.platform",
            "from mrtpo_verl.compat.verl import engine_device",
            "print(engine_device())",
        )
    )
    env = {**os.environ, "VERL_PLATFORM": "cpu"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "cpu"


@covers("verl.actor_param_dtype")
def test_actor_dtype_defaults_to_bf16_as_verls_fsdp_engine() -> None:
    from verl.workers.engine.fsdp import transformer_impl

    from mrtpo_verl.compat.verl import actor_param_dtype

    assert 'mixed_precision_config.get("param_dtype", "bf16")' in inspect.getsource(transformer_impl)

    def config(mixed: dict | None) -> Any:
        fsdp = {"mixed_precision": mixed} if mixed is not None else {}
        return OmegaConf.create({"actor_rollout_ref": {"actor": {"fsdp_config": fsdp}}})

    assert actor_param_dtype(config(None)) == torch.bfloat16
    assert actor_param_dtype(config({"param_dtype": "fp32"})) == torch.float32


@covers("verl_registries.engine_registered", "verl_registries.register_rollout_adapter")
def test_cpu_engine_and_rollout_registrations() -> None:
    from verl.workers.rollout.base import get_rollout_class

    from mrtpo_cpu.engine import register_cpu_engines
    from mrtpo_verl.compat.verl_registries import engine_registered, register_rollout_adapter

    register_cpu_engines()
    assert engine_registered("language_model", "fsdp2", "cpu")
    assert not engine_registered("language_model", "fsdp2", "no-such-device")
    register_rollout_adapter("mrtpo-contract", "async", "collections.OrderedDict")
    import collections

    assert get_rollout_class("mrtpo-contract", "async") is collections.OrderedDict


# --- compat.verl: worker-group calls -------------------------------------------------------------------------


def _answers(ranks: int) -> list[Any]:
    """Per-rank ``DataProto`` answers: a (2, 3) float tensor, a label per row, the rank's time as a metric."""
    from verl.protocol import DataProto

    answers = []
    for rank in range(ranks):
        answer = DataProto.from_dict(
            tensors={"x": torch.full((2, 3), float(rank))},
            non_tensors={"label": np.array([f"{rank}.{row}" for row in range(2)], dtype=object)},
        )
        answer.meta_info["metrics"] = {"t": float(rank)}
        answers.append(answer)
    return answers


def _masked(answers: list[Any], collect_mask: list[bool]) -> list[Any]:
    """The answers as the ranks give them: None from a rank whose answer verl does not collect."""
    return [answer if keep else None for answer, keep in zip(answers, collect_mask, strict=True)]


def _worker_group(ranks: int, mesh: str, collect_mask: list[bool]) -> Any:
    """A verl ``WorkerGroup`` of ``ranks`` workers whose ranks on ``mesh`` are collected where ``collect_mask``."""
    from verl.single_controller.base.worker_group import WorkerGroup

    class Group(WorkerGroup):
        queries = 0

        def _query_collect_info(self, mesh_name: str) -> list[bool]:
            assert mesh_name == mesh
            self.queries += 1
            return list(collect_mask)

    group = Group(resource_pool=None)
    group._workers = list(range(ranks))
    group._dispatch_info[mesh] = list(range(ranks))  # what verl's lazy dispatch has cached by the time it collects
    return group


@covers("verl.dp_dispatch_with_collect", "verl.mesh_dispatch_with_collect")
def test_our_collect_modes_split_as_verl_and_collect_what_verl_would_concatenate() -> None:
    from verl.protocol import DataProto
    from verl.single_controller.base.decorator import (
        Dispatch,
        get_predefined_dispatch_fn,
        make_nd_compute_dataproto_dispatch_fn,
    )

    from mrtpo_verl.compat.verl import dp_dispatch_with_collect, mesh_dispatch_with_collect

    def concat(answers: list[Any]) -> Any:
        merged = DataProto.concat(answers)
        answers.clear()
        return merged

    dp_mode = dp_dispatch_with_collect(concat)
    verl_dp = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_PROTO)
    assert dp_mode["dispatch_fn"] is verl_dp["dispatch_fn"]
    group = _worker_group(4, "actor", [True] * 4)
    ours, theirs = dp_mode["collect_fn"](group, _answers(4)), verl_dp["collect_fn"](group, _answers(4))
    assert torch.equal(ours.batch["x"], theirs.batch["x"]) and ours.meta_info == theirs.meta_info

    mask = [True, False, True, False]
    mesh_mode = mesh_dispatch_with_collect("actor", concat)
    verl_mesh = make_nd_compute_dataproto_dispatch_fn("actor")
    ours_group, verl_group = _worker_group(4, "actor", mask), _worker_group(4, "actor", mask)
    ours = mesh_mode["collect_fn"](ours_group, _masked(_answers(4), mask))
    theirs = verl_mesh["collect_fn"](verl_group, _masked(_answers(4), mask))
    assert ours.batch["x"][:, 0].tolist() == theirs.batch["x"][:, 0].tolist() == [0.0, 0.0, 2.0, 2.0]
    assert ours.non_tensor_batch["label"].tolist() == theirs.non_tensor_batch["label"].tolist()
    assert ours.meta_info == theirs.meta_info == {"metrics": {"t": [0.0, 2.0]}}
    assert ours_group.queries == verl_group.queries == 1
    mesh_mode["collect_fn"](ours_group, _answers(4))
    assert ours_group.queries == 1  # the mask verl cached is reused, as verl reuses it
    source = inspect.getsource(verl_mesh["dispatch_fn"].func)
    assert "worker_group._dispatch_info[mesh_name]" in source


@covers("verl.dp_dispatch_with_collect", "verl.mesh_dispatch_with_collect")
def test_a_worker_group_call_hands_the_collect_the_only_references_to_the_answers(transfer_queue: Any) -> None:
    """Through verl's own worker-group call and a real ``ray.get``: emptying the list releases every answer."""
    import weakref

    from verl.single_controller.ray.base import func_generator

    from mrtpo_verl.compat.verl import dp_dispatch_with_collect, mesh_dispatch_with_collect

    seen: dict[str, list[bool]] = {}

    def collect(answers: list[Any]) -> str:
        refs = [weakref.ref(answer.batch["x"]) for answer in answers]
        answers.clear()
        seen["released"] = [ref() is None for ref in refs]
        return "collected"

    for mode, mask in (
        (dp_dispatch_with_collect(collect), [True] * 4),
        (mesh_dispatch_with_collect("actor", collect), [True, False, True, False]),
    ):
        group = _worker_group(4, "actor", mask)
        stored = [ray.put(answer) for answer in _masked(_answers(4), mask)]
        call = func_generator(
            group,
            "compute",
            dispatch_fn=lambda worker_group, *args, **kwargs: (args, kwargs),
            collect_fn=mode["collect_fn"],
            execute_fn=lambda method_name, *args, stored=stored, **kwargs: list(stored),
            blocking=True,
        )
        seen.clear()
        assert call() == "collected"
        assert seen["released"] == [True] * sum(mask)


# --- compat.ray, compat.transformers, compat.torch_fsdp, compat.omegaconf -------------------------------------


@covers("ray.liveness_call")
def test_ray_actors_have_the_liveness_method() -> None:
    source = inspect.getsource(importlib.import_module("ray.actor"))
    assert "def __ray_ready__(self):" in source


@covers("transformers.full_attention_cache_layers", "transformers.cache_from_layers")
def test_a_real_models_cache_round_trips() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import DynamicCache

    from mrtpo_verl.compat.transformers import cache_from_layers, full_attention_cache_layers

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        whole = model(ids).logits[:, -2:]
        cache = model(ids[:, :3], use_cache=True).past_key_values
        layers = full_attention_cache_layers(cache)
        assert len(layers) == 2 and layers[0][0].shape[-2] == 3
        expanded = cache_from_layers(layers, 2)
        rest = model(ids[:, 3:].expand(2, -1), past_key_values=expanded).logits
    assert torch.allclose(rest[0], whole[0], atol=1e-5) and torch.allclose(rest[1], whole[0], atol=1e-5)
    assert layers[0][0].shape[-2] == 3  # the one-row prefix was not grown by the call
    keys = torch.zeros(1, 1, 4, 2)
    with pytest.raises(NotImplementedError, match="share_prefix=false"):
        full_attention_cache_layers(DynamicCache(ddp_cache_data=[(keys, keys, torch.tensor([4]))]))  # sliding window


@covers(
    "torch_fsdp.wrapped_module",
    "torch_fsdp.is_fsdp2",
    "torch_fsdp.first_fsdp2_module",
    "torch_fsdp.keep_unsharded",
    "torch_fsdp.reshard",
)
def test_fsdp2_module_methods() -> None:
    from torch.distributed.fsdp import FSDPModule

    from mrtpo_verl.compat.torch_fsdp import first_fsdp2_module, is_fsdp2, wrapped_module

    plain = torch.nn.Linear(2, 2)
    assert wrapped_module(plain) is plain and not is_fsdp2(plain) and first_fsdp2_module(plain, None) is None
    for name in ("unshard", "reshard", "set_reshard_after_forward"):
        assert callable(getattr(FSDPModule, name)), f"FSDPModule.{name}"
    assert "recurse" in inspect.signature(FSDPModule.set_reshard_after_forward).parameters
    from torch.distributed.fsdp import FullyShardedDataParallel

    assert "_fsdp_wrapped_module" in inspect.getsource(importlib.import_module(FullyShardedDataParallel.__module__))


@covers("torch_fsdp.TESTED_TORCH")
def test_the_torch_these_tests_run_on_is_in_the_tested_range() -> None:
    """The range the start-up warning and setup.py state is the one these contract tests pass on."""
    from mrtpo_verl.compat.torch_fsdp import TESTED_TORCH
    from mrtpo_verl.startup.torch_version import untested_torch

    assert untested_torch(torch.__version__) is None, f"torch {torch.__version__} outside {TESTED_TORCH}"


#: Run in its own process: it starts a one-rank gloo process group, which must not outlive the test.
FSDP_INPUT_CAST_PROBE = """
import os, tempfile
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from mrtpo_verl.compat.torch_fsdp import forward_inputs_uncast

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
fully_shard(model[1], mp_policy=policy)
fully_shard(model, mp_policy=policy)
seen = []
model[1].register_forward_pre_hook(lambda module, args: seen.append(str(args[0].dtype)))
x = torch.randn(2, 4)
with torch.no_grad():
    model[1](x)
    with forward_inputs_uncast(model):
        try:
            model[1](x)
        except RuntimeError:
            seen.append("float32 input reached the bf16 layer")
    model[1](x)
dist.destroy_process_group()
print(seen)
"""


@covers("torch_fsdp.forward_inputs_uncast")
def test_fsdp2_input_cast_is_turned_off_and_restored() -> None:
    """FSDP2 casts a sharded module's inputs to ``param_dtype`` before its own pre-forward hooks run; inside the
    context it does not (the bf16 layer then refuses the float32 input: no cast happened), and after it does again."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FSDP_INPUT_CAST_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = done.stdout.strip().splitlines()[-1]
    assert seen == str(["torch.bfloat16", "torch.float32", "float32 input reached the bf16 layer", "torch.bfloat16"])


#: Run in its own process (a one-rank gloo group). Float32 masters under bf16 mixed precision, the root owning the
#: first layer's parameters and the second layer sharded on its own, as verl shards decoder layers.
FSDP_GATHER_AS_STORED_PROBE = """
import copy
import tempfile
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from mrtpo_verl.compat.torch_fsdp import gathered_as_stored

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
plain.load_state_dict(model.state_dict())
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
fully_shard(model[1], mp_policy=policy)
fully_shard(model, mp_policy=policy, reshard_after_forward=False)
fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))  # its first forward: inside the block
fresh.load_state_dict(plain.state_dict())
fully_shard(fresh[1], mp_policy=policy)
fully_shard(fresh, mp_policy=policy)
seen = []
# Registered after FSDP's pre-forward (which FSDP prepends): the weight as gathered for this call.
model[1].register_forward_pre_hook(lambda module, args: seen.append(str(module.weight.dtype)))
x = torch.randn(2, 4)
with torch.no_grad():
    before = model(x)
    with gathered_as_stored(model):
        inside = model(x)
        again = model(x)
    after = model(x)
    with gathered_as_stored(fresh):
        fresh_inside = fresh(x)
    fresh_after = fresh(x)
    with gathered_as_stored(model, torch.float16):  # the fp16-matmul replay's gather: shards cast to fp16 first
        half = model(x.half())
    after_half = model(x)
    plain_half = copy.deepcopy(plain).half()
print(seen)
print(before.dtype, inside.dtype)
print(torch.equal(inside, plain(x)), torch.equal(again, inside), torch.equal(after, before))
print(torch.equal(fresh_inside, inside), torch.equal(fresh_after, before))
print(half.dtype, torch.equal(half, plain_half(x.half())), torch.equal(after_half, before))
dist.destroy_process_group()
"""


@covers("torch_fsdp.gathered_as_stored")
def test_fsdp2_gathers_float32_masters_as_float32_inside_and_as_bf16_after() -> None:
    """Inside the context the layers get their float32 shards gathered as float32 and float32 inputs (the output is
    the unsharded float32 model's, bit for bit); before and after, the bf16 gather and cast (the same output), also
    for a model whose first forward (FSDP's lazy initialisation) ran inside the context; with ``gather_dtype`` fp16
    the shards are gathered as fp16."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FSDP_GATHER_AS_STORED_PROBE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    weights, dtypes, same, fresh, half = done.stdout.strip().splitlines()[-5:]
    assert weights == str(
        ["torch.bfloat16", "torch.float32", "torch.float32", "torch.bfloat16", "torch.float16", "torch.bfloat16"]
    )
    assert dtypes == "torch.bfloat16 torch.float32"
    assert same == "True True True"
    assert fresh == "True True"  # FSDP's lazy initialisation ran inside the block: the bf16 gather still follows
    # gather_dtype=fp16: the float32 masters cast to fp16 before the gather (the fp16 model's output exactly); the
    # bf16 gather after.
    assert half == "torch.float16 True True"


@covers("transformers.float32_capable_attention")
def test_flash_attention_is_replaced_by_sdpa_for_the_block_and_restored() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from mrtpo_verl.compat.transformers import float32_capable_attention

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config).eval()
    for implementation in ("sdpa", "eager", "flex_attention"):  # these compute in float32: left alone
        model.config._attn_implementation_internal = implementation
        with float32_capable_attention(model) as replaced:
            assert replaced == [] and model.config._attn_implementation == implementation
    # transformers checks flash kernels at construction, so the implementation is set on the built model.
    model.config._attn_implementation_internal = "flash_attention_2"
    with float32_capable_attention(model) as replaced:
        assert replaced == ["flash_attention_2"]
        assert model.config._attn_implementation == "sdpa"
        assert model.model.layers[0].self_attn.config._attn_implementation == "sdpa"  # read at every forward
    assert model.config._attn_implementation == "flash_attention_2"
    with pytest.raises(RuntimeError), float32_capable_attention(model):
        raise RuntimeError("a failing pass")
    assert model.config._attn_implementation == "flash_attention_2"


@covers("omegaconf.written_value", "omegaconf.WrittenValue")
def test_config_values_as_written() -> None:
    from mrtpo_verl.compat.omegaconf import WrittenValue, written_value

    config = OmegaConf.create({"a": 1, "b": "${a}", "c": None, "d": {"e": 2}, "f": [1]})
    a, b, c = (written_value(config, key) for key in "abc")
    assert isinstance(a, WrittenValue) and (a.value, a.is_interpolation, a.is_none) == (1, False, False)
    assert b.is_interpolation and b.value is None and c.is_none
    assert written_value(config, "d") is config.d and written_value(config, "f") is config.f


# --- public names of verl used directly ------------------------------------------------------------------------


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
    """The reason the advantage step opens advantage_inputs(...): verl passes non_tensor_batch to 'gdpo' only."""
    source = inspect.getsource(compute_advantage)
    assert 'if adv_estimator in (AdvantageEstimator.GDPO, "gdpo"):' in source
    assert 'adv_kwargs["non_tensor_batch"] = data.non_tensor_batch' in source


def test_registry_functions_and_grpo_helper_signature() -> None:
    assert callable(core_algos.register_adv_est) and callable(core_algos.get_adv_estimator_fn)
    params = list(inspect.signature(core_algos.compute_grpo_outcome_advantage).parameters)
    assert params == ["token_level_rewards", "response_mask", "index", "epsilon", "norm_adv_by_std_in_grpo", "config"]
    assert core_algos.get_adv_estimator_fn("mrtpo") is compute_mrtpo_outcome_advantage


@covers("verl_registries.ESTIMATOR_REGISTRY_MODULE", "verl_registries.TRAINER_REGISTRY_MODULE")
def test_the_registry_modules_the_plugin_waits_for_hold_each_registry_and_its_look_up() -> None:
    """compat.verl_registries: the plugin registers when these modules finish importing, so each must define
    both the register call and the look-up that reads the registry."""
    from verl.trainer.ppo.v1 import trainer_base

    from mrtpo_verl.compat.verl_registries import ESTIMATOR_REGISTRY_MODULE, TRAINER_REGISTRY_MODULE

    assert core_algos.__name__ == ESTIMATOR_REGISTRY_MODULE and trainer_base.__name__ == TRAINER_REGISTRY_MODULE
    assert {"register_adv_est", "get_adv_estimator_fn", "ADV_ESTIMATOR_REGISTRY"} <= set(vars(core_algos))
    assert {"register_trainer", "get_trainer_cls", "TRAINER_REGISTRY"} <= set(vars(trainer_base))
    assert trainer_base.get_trainer_cls("mrtpo_sync").__module__ == "mrtpo_verl.trainer.mrtpo_trainer"


@covers(
    "verl_registries.ENGINE_REGISTRY_MODULE",
    "verl_registries.CHECKPOINT_ENGINE_REGISTRY_MODULE",
    "verl_registries.ROLLOUT_REPLICA_REGISTRY_MODULE",
    "verl_registries.ROLLOUT_ADAPTER_REGISTRY_MODULE",
)
def test_the_registry_modules_the_cpu_backend_waits_for_hold_each_registry_and_its_look_up() -> None:
    """The CPU backend registers when these modules finish importing: each must hold its registry and look-up
    (the two packages import them in their own ``__init__``, which runs before any import of a submodule)."""
    from verl import checkpoint_engine, workers
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout import replica

    from mrtpo_verl.compat import verl_registries as names

    engine = workers.engine
    assert engine.__name__ == names.ENGINE_REGISTRY_MODULE and hasattr(engine.EngineRegistry, "get_engine_cls")
    assert engine.FSDPEngineWithLMHead is FSDPEngineWithLMHead
    assert checkpoint_engine.__name__ == names.CHECKPOINT_ENGINE_REGISTRY_MODULE
    assert hasattr(checkpoint_engine.CheckpointEngineRegistry, "new")
    assert replica.__name__ == names.ROLLOUT_REPLICA_REGISTRY_MODULE and hasattr(replica.RolloutReplicaRegistry, "get")
    assert rollout_base.__name__ == names.ROLLOUT_ADAPTER_REGISTRY_MODULE
    assert {"_ROLLOUT_REGISTRY", "get_rollout_class"} <= set(vars(rollout_base))


def test_gdpo_reads_its_reward_keys_and_weights_from_algo_config() -> None:
    source = inspect.getsource(core_algos.compute_gdpo_outcome_advantage)
    assert 'config.get("gdpo_reward_keys", None)' in source
    assert 'config.get("gdpo_reward_weights", None)' in source
    assert "verl_F.masked_whiten(new_advantage, response_mask) * response_mask" in source
    fields = AlgoConfig.__dataclass_fields__
    assert "gdpo_reward_keys" in fields and "gdpo_reward_weights" in fields


def test_our_whitening_formula_equals_verls_masked_whiten() -> None:
    """whiten_with_statistics repeats masked_whiten's formula; it must stay identical."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        values = torch.randn(8, 13, generator=generator) * 3
        mask = (torch.rand(8, 13, generator=generator) > 0.3).float()
        mean, variance = verl_F.masked_mean(values, mask), verl_F.masked_var(values, mask)
        assert torch.equal(whiten_with_statistics(values, mean, variance), verl_F.masked_whiten(values, mask))


@covers("verl.fields_of_verl_config_check", "verl.VERL_CHECK_FIELDS")
def test_validate_config_still_asserts_the_texts_we_map_to_fields() -> None:
    from verl.utils import config as verl_config

    from mrtpo_verl.compat.verl import VERL_CHECK_FIELDS, fields_of_verl_config_check

    source = inspect.getsource(verl_config.validate_config)
    for text in VERL_CHECK_FIELDS:
        assert text in source, f"verl's validate_config no longer says {text!r}"
    message = "real_train_batch_size (6) must be divisible by minimal possible batch size (4)"
    assert fields_of_verl_config_check(message)[0] == VERL_CHECK_FIELDS["real_train_batch_size"]
    assert fields_of_verl_config_check("an unrelated assertion") == []
