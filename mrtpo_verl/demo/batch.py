"""Sample, score and pack one demo batch as a verl ``DataProto``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.protocol import DataProto

from mrtpo_verl.demo.tasks import DemoPrompt
from reward_fns import dispatch

__all__ = ["SampledResponse", "pack_batch", "sample_group"]


class SampledResponse:
    """One response of a group with its scores (the reward function's full dict)."""

    def __init__(
        self, prompt_index: int, prompt_ids: list[int], response_ids: list[int], label: str, scores: dict[str, Any]
    ) -> None:
        self.prompt_index = prompt_index
        self.prompt_ids = prompt_ids
        self.response_ids = response_ids
        self.label = label
        self.scores = scores


def _trim_at_eos(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    if eos_id in ids:
        return ids[: ids.index(eos_id) + 1]
    while ids and ids[-1] == pad_id and pad_id != eos_id:
        ids = ids[:-1]
    return ids


def sample_group(
    model: Any,
    tokenizer: Any,
    prompt: DemoPrompt,
    prompt_index: int,
    samples: int,
    max_new_tokens: int,
    temperature: float,
    include_reference: bool,
    families: Sequence[str],
) -> list[SampledResponse]:
    """``samples`` sampled responses (plus the reference answer if asked and available), scored."""
    encoded = tokenizer.apply_chat_template(
        prompt.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    prompt_ids = encoded["input_ids"][0]
    with torch.inference_mode():
        generated = model.generate(
            input_ids=prompt_ids[None].repeat(samples, 1),
            attention_mask=torch.ones(samples, len(prompt_ids), dtype=torch.long),
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )[:, len(prompt_ids) :]
    rows = [
        (_trim_at_eos(row.tolist(), tokenizer.eos_token_id, tokenizer.pad_token_id), f"sample {i + 1}")
        for i, row in enumerate(generated)
    ]
    if include_reference and prompt.reference is not None:
        reference_ids = tokenizer(prompt.reference, add_special_tokens=False)["input_ids"]
        rows.append(([*reference_ids, tokenizer.eos_token_id], "reference answer (added, not sampled)"))
    responses = []
    for ids, label in rows:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        scores = dispatch.compute_score(prompt.data_source, text, prompt.ground_truth, families=list(families))
        responses.append(SampledResponse(prompt_index, prompt_ids.tolist(), ids, label, scores))
    return responses


def pack_batch(
    responses: Sequence[SampledResponse], prompts: Sequence[DemoPrompt], reward_keys: Sequence[str], pad_id: int
) -> DataProto:
    """verl's layout: left-padded prompts, right-padded responses, masks, uid and the reward function's keys."""
    bs = len(responses)
    width_p = max(len(r.prompt_ids) for r in responses)
    width_r = max(1, max(len(r.response_ids) for r in responses))
    tensors = {
        "prompts": torch.full((bs, width_p), pad_id),
        "responses": torch.full((bs, width_r), pad_id),
        "response_mask": torch.zeros(bs, width_r, dtype=torch.long),
    }
    prompt_mask = torch.zeros(bs, width_p, dtype=torch.long)
    for i, response in enumerate(responses):
        p, r = response.prompt_ids, response.response_ids
        tensors["prompts"][i, width_p - len(p) :] = torch.tensor(p)
        prompt_mask[i, width_p - len(p) :] = 1
        tensors["responses"][i, : len(r)] = torch.tensor(r, dtype=torch.long)
        tensors["response_mask"][i, : len(r)] = 1
    tensors["attention_mask"] = torch.cat([prompt_mask, tensors["response_mask"]], dim=1)
    tensors["token_level_rewards"] = torch.zeros(bs, width_r)
    raw = np.empty(bs, dtype=object)
    raw[:] = [prompts[r.prompt_index].messages for r in responses]
    non_tensors: dict[str, np.ndarray] = {
        "uid": np.array([f"prompt-{r.prompt_index}" for r in responses], dtype=object),
        "raw_prompt": raw,
    }

    def column(key: str, dtype: Any) -> np.ndarray:
        return np.array([r.scores[key] for r in responses], dtype=dtype)

    for key in reward_keys:
        non_tensors[key] = column(key, np.float64)
        non_tensors[dispatch.info_key(key)] = column(dispatch.info_key(key), object)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
