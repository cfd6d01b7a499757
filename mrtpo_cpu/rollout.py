"""An HF-transformers rollout for verl's rollout registries, for CPU runs (no vLLM/SGLang).

verl 0.9.1 has two registries for a rollout backend, and this module fills both under the name
``hf`` (``actor_rollout_ref.rollout.name=hf``):

- ``verl.workers.rollout.replica.RolloutReplicaRegistry`` — the *replica* the trainer's
  ``LLMServerManager`` launches: here :class:`HFReplica`, which starts one :class:`HFLLMServer`
  Ray actor per replica. The agent loop's ``LLMServerClient`` calls its ``generate`` with
  token ids and sampling parameters and gets a ``TokenOutput`` back, as from vLLM.
- ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` — the *adapter* class that verl's
  ``ActorRolloutRefWorker`` builds inside the actor process (``get_rollout_class``): here
  :class:`HFServerAdapter`, which receives the actor's weights in verl's ``naive``
  (colocated) weight sync and loads them into the server. In a standalone replica
  (``separate_async``) verl builds the adapter inside a ``CheckpointEngineWorker`` instead, which
  feeds it what the checkpoint engine received (on CPU the ``gloo`` engine,
  :mod:`mrtpo_cpu.gloo_checkpoint_engine`).

The server generates with ``model.generate`` one request at a time (CPU), sampling with the
request's temperature / top-p / top-k, at most ``rollout.response_length`` new tokens.

Reproducible sampling (verl's ``rollout.full_determinism=True``): the server samples each request
from its own seed, :func:`request_seed`, not from one stream shared in arrival order, so a sample does
not depend on which agent-loop worker asked first, and the same seed and data give the same responses
run after run. What names a sample: the rollout seed, the weights loaded so far, the request id (verl's
agent loops send ``det-<priority>``), the prompt's tokens, and how many requests with the same id and
prompt this server has sampled on these weights. The last two are needed because verl's v1 trainers
give every response of a prompt (and every prompt without a ``priority`` field) the same id, ``det-0``;
the ``n`` responses of one prompt are then told apart by their order among themselves, which verl keeps
(its sessions ``0..n-1`` are started in order, and requests take this server's lock in arrival order).

Partial rollouts (verl's ``colocate_async``/``separate_async``): ``abort_all_requests`` stops the
request being generated after its current token (a ``StoppingCriteria`` reads the abort flag) and
returns the tokens so far with ``stop_reason="aborted"``; requests that arrive while generation is
paused wait for ``resume_generation`` (or, with ``reject_request=True``, come back aborted and
empty at once). verl's ``FullyAsyncLLMServerClient`` then re-sends prompt + partial response with
the remaining budget, so the response continues under the new weights, each piece tagged with the
``global_steps`` of the weights that produced it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

__all__ = [
    "ROLLOUT_NAME",
    "WEIGHTS_LOADED",
    "HFLLMServer",
    "HFReplica",
    "HFServerAdapter",
    "parameter_checksum",
    "request_seed",
    "server_name",
]

logger = logging.getLogger(__name__)

#: ``actor_rollout_ref.rollout.name`` of this backend (registered by :mod:`mrtpo_cpu.register`).
ROLLOUT_NAME = "hf"
#: Start of the line a server prints after loading weights (tests read it from the run's log).
WEIGHTS_LOADED = "hf rollout: loaded weights"


def request_seed(
    seed: int,
    weight_version: int,
    global_steps: int | None,
    request_id: str,
    prompt_ids: Sequence[int] = (),
    occurrence: int = 0,
) -> int:
    """Seed of one request's sampling under full determinism: a 63-bit hash of what names the sample.

    ``weight_version`` (loads so far) and ``global_steps`` make a step's requests differ from the previous
    step's; ``occurrence`` (the how-manieth request with this id and prompt on these weights) tells apart
    the responses of one prompt that arrive under one id. The hash (BLAKE2b) does not depend on the
    process, unlike Python's ``hash``.
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{seed}|{weight_version}|{global_steps}|{request_id}|{occurrence}|".encode())
    digest.update(array("q", prompt_ids).tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1


def server_name(replica_rank: int) -> str:
    """Ray actor name of a replica's server (the adapter finds its server by it)."""
    return f"mrtpo_cpu_hf_server_{replica_rank}"


class HFLLMServer:
    """A token-in/token-out generation server on an HF causal LM (a Ray actor; async methods).

    Args:
        model_path: local HF model directory (the actor's ``model.path``).
        prompt_length, response_length: the rollout config's lengths (cap on new tokens).
        torch_threads: intra-op threads of this process.
        seed: seed of the sampling generator (the rollout config's ``seed``).
        replica_rank: the replica this server belongs to (named in its log lines).
        full_determinism: sample each request from its own seed (:func:`request_seed`), not from
            one stream in arrival order (the rollout config's ``full_determinism``).
    """

    def __init__(
        self,
        model_path: str,
        prompt_length: int,
        response_length: int,
        torch_threads: int = 1,
        seed: int = 0,
        replica_rank: int = -1,
        full_determinism: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, torch_threads))
        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.replica_rank = replica_rank
        self.seed = seed
        self.full_determinism = full_determinism
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.global_steps: int | None = None
        self.weight_version = 0
        # Requests seen per (id, prompt) on the current weights (full determinism's occurrence count).
        self._occurrences: Counter[tuple[str, tuple[int, ...]]] = Counter()
        self._occurrences_on: tuple[int, int | None] = (self.weight_version, None)
        self._lock = asyncio.Lock()
        self._eos_ids = _eos_ids(self.model, self.tokenizer)
        # Partial rollout: the gate is open while generation may run; the flag stops the running request.
        self._gate = asyncio.Event()
        self._gate.set()
        self._abort = threading.Event()
        self._reject = False

    # -- generation -----------------------------------------------------------------------
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        while True:
            if not self._gate.is_set() and self._reject:
                return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted", extra_fields=self._version())
            await self._gate.wait()
            async with self._lock:  # one request at a time: the CPU is the bottleneck anyway
                if self._gate.is_set():  # not paused while this request queued for the lock
                    seed = self._sample_seed(request_id, prompt_ids) if self.full_determinism else None
                    return await asyncio.to_thread(self._generate, list(prompt_ids), dict(sampling_params), seed)

    def _sample_seed(self, request_id: str, prompt_ids: Sequence[int]) -> int:
        """This request's :func:`request_seed`, counting it among the same (id, prompt) on these weights."""
        weights = (self.weight_version, self.global_steps)
        if weights != self._occurrences_on:
            self._occurrences.clear()
            self._occurrences_on = weights
        key = (request_id, tuple(prompt_ids))
        occurrence = self._occurrences[key]
        self._occurrences[key] += 1
        return request_seed(self.seed, *weights, request_id, prompt_ids, occurrence)

    def _version(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps}

    def _generate(self, prompt_ids: list[int], params: dict[str, Any], seed: int | None = None) -> TokenOutput:
        max_new = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if max_new is None:
            max_new = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_new = max(1, int(max_new))
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1))
        want_logprobs = bool(params.get("logprobs", False))
        do_sample = temperature > 0
        generate_kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "do_sample": do_sample,
            "eos_token_id": self._eos_ids,
            "pad_token_id": self._eos_ids[0],
            "output_scores": want_logprobs,
            "return_dict_in_generate": True,
        }
        if do_sample:
            generate_kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else 0)
        else:
            generate_kwargs.update(temperature=None, top_p=None, top_k=None)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        # transformers samples from torch's global generator; under full determinism it is set to the
        # request's own seed for this call and restored after (one request runs at a time).
        with torch.random.fork_rng(devices=[], enabled=seed is not None), torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                stopping_criteria=[_StopOnFlag(self._abort)],
                **generate_kwargs,
            )
        tokens = out.sequences[0, input_ids.shape[1] :].tolist()
        # Cut after the first end-of-sequence token (HF pads the rest of a batch with it).
        finished = False
        for position, token in enumerate(tokens):
            if token in self._eos_ids:
                tokens, finished = tokens[: position + 1], True
                break
        aborted = self._abort.is_set() and not finished and len(tokens) < max_new
        log_probs = None
        if want_logprobs:
            log_probs = [
                float(torch.log_softmax(score[0].float(), dim=-1)[token])
                for score, token in zip(out.scores, tokens, strict=False)
            ]
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason="aborted" if aborted else "completed",
            extra_fields=self._version(),
        )

    # -- weights --------------------------------------------------------------------------
    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> float:
        """Load the actor's weights (HF names); returns the seconds it took."""
        start = time.perf_counter()
        async with self._lock:
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        if unexpected or [name for name in missing if not name.endswith("lm_head.weight")]:
            raise ValueError(f"hf rollout: weights do not match the model (missing {missing}, unexpected {unexpected})")
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        # One line per load (Ray forwards it to the driver's log): which replica got which weights.
        print(
            f"{WEIGHTS_LOADED} replica={self.replica_rank} global_steps={self.global_steps} "
            f"version={self.weight_version} checksum={parameter_checksum(self.model)!r}",
            flush=True,
        )
        return time.perf_counter() - start

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def get_weight_version(self) -> int:
        return self.weight_version

    async def state_dict_checksum(self) -> float:
        """Sum of all parameters (tests compare it with the actor's)."""
        return parameter_checksum(self.model)

    # -- lifecycle verl's replicas and checkpoint manager call; nothing to free on CPU ------
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Pause: stop the running request after its current token and hold (or reject) new ones."""
        running = self._lock.locked()
        self._reject = reject_request
        self._gate.clear()
        self._abort.set()
        async with self._lock:  # the running request has returned its partial output
            pass
        return {"aborted_count": int(running), "request_ids": []}

    async def resume_generation(self) -> None:
        """Open the gate again: held requests and verl's re-sent partial ones generate."""
        self._abort.clear()
        self._reject = False
        self._gate.set()

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


def parameter_checksum(model: torch.nn.Module) -> float:
    """Sum of every parameter in float64 (tied weights once): equal models give equal sums."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


class _StopOnFlag:
    """A ``transformers`` stopping criterion: stop every sequence once ``flag`` is set (abort)."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = list(eos) if isinstance(eos, list | tuple) else [eos]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return [int(i) for i in ids]


class HFReplica(RolloutReplica):
    """verl rollout replica that serves generation from one :class:`HFLLMServer` actor."""

    async def launch_servers(self) -> None:
        model_path = str(getattr(self.model_config, "local_path", None) or self.model_config.path)
        threads = int(os.environ.get("MRTPO_CPU_ROLLOUT_THREADS", "1"))
        server = (
            ray.remote(HFLLMServer)
            .options(name=server_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(
                model_path=model_path,
                prompt_length=int(self.config.prompt_length),
                response_length=int(self.config.response_length),
                torch_threads=threads,
                seed=int(getattr(self.config, "seed", 0)),
                replica_rank=self.replica_rank,
                full_determinism=bool(getattr(self.config, "full_determinism", False)),
            )
        )
        await server.get_weight_version.remote()  # wait until the model is loaded
        self.servers = [server]
        self._server_handle = server
        self._server_address = server_name(self.replica_rank)

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """The actor-side half of the ``hf`` rollout (verl's ``BaseRollout`` role): weight sync.

    verl's ``ActorRolloutRefWorker.update_weights`` (``naive`` backend, colocated sync training)
    calls ``resume``, ``update_weights(per_tensor_param, ...)`` and ``resume`` again. Every rank
    drains the weight generator (it may run collectives); the first rank of each replica sends
    the full tensors to its server.
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self.sleep_level = 1
        self.last_sync: dict[str, float] = {}

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout: weight wire format {wire_format!r} (only named_tensors)")
        start = time.perf_counter()
        state_dict = {}
        # naive sync hands a generator; a checkpoint engine's receive_weights (separate_async) an async one.
        async for name, tensor in ensure_async_iterator(weights):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            state_dict[name] = full.detach().to("cpu", copy=True)
        if self.rollout_rank != 0:
            return
        server = ray.get_actor(server_name(self.replica_rank))
        load_s = await server.update_weights.remote(ray.put(state_dict), kwargs.get("global_steps"))
        self.last_sync = {"collect_s": time.perf_counter() - start, "load_s": float(load_s)}
