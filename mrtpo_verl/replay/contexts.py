"""Replay contexts: the prompt rendered with all verifier information, and with each piece left out.

    C    = render(x, {v_1..v_K})            full context
    C_-k = render(x, {v_i : i != k})        leave-one-out context of reward k

``render`` puts a verifier block (header + one item per included verifier, in :func:`verifier_order`) at the
end of the last user turn, from chat messages or from the rollout's own prompt token ids; the response ids
are reused unchanged. Over-long contexts cut the verifier texts, never the prompt or the response
(:class:`ContextOverBudget` when even that does not fit). The rules in full: ``docs/replay.md`` ("Contexts").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from mrtpo_verl.config import ReplayConfig

__all__ = [
    "TRUNCATION_MARKER",
    "ContextOverBudget",
    "ReplayContextBuilder",
    "ReplayContexts",
    "count_truncated_verifiers",
    "group_constant_flags",
    "verifier_order",
]

#: Appended to a verifier text that was cut to fit ``max_context_tokens``.
TRUNCATION_MARKER = "…[truncated]"

# Content of the probe conversation used to learn where a chat template ends a user turn.
_PROBE_CONTENT = "MRTPO_PROBE_USER_CONTENT"

_Renderer = Callable[[str], tuple[int, ...]]  # verifier block ("" for none) → context token ids


class ContextOverBudget(ValueError):
    """A response's contexts do not fit ``max_context_tokens`` even with every verifier text cut to the marker."""


@dataclass(frozen=True)
class ReplayContexts:
    """The replay inputs of one response.

    Attributes:
        full_context_ids: (len C,) token ids of the full context ``C``.
        leave_one_out_ids: K tuples, ``leave_one_out_ids[k]`` the token ids of ``C_-k``.
        response_ids: (T,) the response token ids, unchanged.
        identical_to_full: K flags; True where reward k has no verifier information, so ``C_-k == C`` and
            its relevance is exactly 0 without a forward pass.
        truncated: K flags; True where reward k's verifier text was cut to fit ``max_context_tokens``.
    """

    full_context_ids: tuple[int, ...]
    leave_one_out_ids: tuple[tuple[int, ...], ...]
    response_ids: tuple[int, ...]
    identical_to_full: tuple[bool, ...]
    truncated: tuple[bool, ...]

    @property
    def num_truncated(self) -> int:
        """Verifier texts of this response that were truncated."""
        return sum(self.truncated)


def count_truncated_verifiers(contexts: Sequence[ReplayContexts]) -> int:
    """Truncated verifier texts over a batch (one count per (response, reward)), e.g. for a metric."""
    return sum(item.num_truncated for item in contexts)


class ReplayContextBuilder:
    """Builds :class:`ReplayContexts` with one tokenizer and one rendering configuration.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        reward_keys: the K reward names, in reward order; used as ``{name}`` in the item template.
        verifier_header: first line of the verifier block.
        verifier_item_template: format string with ``{name}`` and ``{info}``, one per included verifier.
        max_context_tokens: budget for the longest context plus the response, in tokens; None = no budget.
        truncation_marker: appended to a truncated verifier text.
        chat_template_kwargs: extra keyword arguments of ``apply_chat_template`` (verl's
            ``data.apply_chat_template_kwargs``, e.g. ``{"enable_thinking": False}``), as the rollout rendered with.
    """

    def __init__(
        self,
        tokenizer: Any,
        reward_keys: Sequence[str],
        verifier_header: str = ReplayConfig.verifier_header,
        verifier_item_template: str = ReplayConfig.verifier_item_template,
        max_context_tokens: int | None = None,
        truncation_marker: str = TRUNCATION_MARKER,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not reward_keys:
            raise ValueError("reward_keys is empty; the replay needs one verifier slot per reward")
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be ≥ 1 or None, got {max_context_tokens}")
        self.tokenizer = tokenizer
        self.reward_keys = tuple(reward_keys)
        self.verifier_header = verifier_header
        self.verifier_item_template = verifier_item_template
        self.max_context_tokens = max_context_tokens
        self.truncation_marker = truncation_marker
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._user_turn_tail: str | None = None  # learnt lazily: only token-id prompts need it
        self._user_turn_tail_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, tokenizer: Any, reward_keys: Sequence[str], replay: ReplayConfig) -> ReplayContextBuilder:
        """A builder with the header, item template, token budget and chat-template kwargs of ``mrtpo.replay``."""
        return cls(
            tokenizer,
            reward_keys,
            verifier_header=replay.verifier_header,
            verifier_item_template=replay.verifier_item_template,
            max_context_tokens=replay.max_context_tokens,
            chat_template_kwargs=replay.chat_template_kwargs,
        )

    def build(
        self,
        prompt: Sequence[Mapping[str, Any]] | Sequence[int] | Any,
        response_ids: Sequence[int] | Any,
        verifier_info: Sequence[str | None] | Any,
        group_constant: Sequence[bool] | None = None,
    ) -> ReplayContexts:
        """Full and leave-one-out contexts of one response.

        Args:
            prompt: chat messages (list of ``{"role", "content"}`` dicts, as in verl's ``raw_prompt``) or the
                prompt's token ids without padding (list, numpy array or 1-D tensor).
            response_ids: (T,) response token ids without padding.
            verifier_info: K verifier-information strings in reward order; None or blank = no information.
            group_constant: K flags, True where the text is the same for every response of this response's group
                (the order rule puts those first, see :func:`verifier_order`); None = a lone response (all True).

        Returns:
            The contexts, with ``identical_to_full`` and ``truncated`` per reward.

        Raises:
            TypeError: a verifier text is neither a string nor None (the message names the reward key), or
                the prompt is neither messages nor token ids.
            ValueError: wrong number of verifier texts, no user turn, or a token-id prompt that does not end
                with a user turn and the generation prompt.
            ContextOverBudget: (a ValueError) the contexts cannot fit ``max_context_tokens`` even with the
                shortest verifier texts.
        """
        texts = self._verifier_texts(verifier_info)
        render = self._renderer(prompt)
        response = _as_token_ids(response_ids, "response_ids")
        included = verifier_order(texts, group_constant)
        texts, truncated = self._fit_to_budget(render, texts, included, len(response))
        full = render(self._block(texts, None, included))
        leave_one_out = tuple(
            render(self._block(texts, k, included)) if texts[k] is not None else full for k in range(len(texts))
        )
        return ReplayContexts(
            full_context_ids=full,
            leave_one_out_ids=leave_one_out,
            response_ids=response,
            identical_to_full=tuple(text is None for text in texts),
            truncated=truncated,
        )

    def build_batch(
        self,
        prompts: Sequence[Any],
        responses: Sequence[Any],
        verifier_infos: Sequence[Sequence[str | None]],
        group_constant: Sequence[Sequence[bool]] | None = None,
    ) -> list[ReplayContexts]:
        """:meth:`build` over a batch; use :func:`count_truncated_verifiers` for the truncation metric.

        Args:
            group_constant: (bs, K) flags from :meth:`group_constant_flags` over the *whole* batch, when this is
                only a shard of it (a data-parallel split may cut a group); None = computed over these rows.
        """
        if not len(prompts) == len(responses) == len(verifier_infos):
            raise ValueError(
                f"batch sizes differ: {len(prompts)} prompts, {len(responses)} responses, "
                f"{len(verifier_infos)} verifier-info rows"
            )
        if group_constant is None:
            group_constant = self.group_constant_flags(prompts, verifier_infos)
        elif len(group_constant) != len(prompts):
            raise ValueError(f"{len(group_constant)} group-constant rows for {len(prompts)} prompts")
        constant = group_constant
        return [
            self.build(prompt, response, info, constant[row])
            for row, (prompt, response, info) in enumerate(zip(prompts, responses, verifier_infos, strict=True))
        ]

    def group_constant_flags(
        self, prompts: Sequence[Any], verifier_infos: Sequence[Sequence[str | None]]
    ) -> list[tuple[bool, ...]]:
        """:func:`group_constant_flags` with this builder's reward count checked."""
        for info in verifier_infos:
            self._verifier_texts(info)
        return group_constant_flags(prompts, verifier_infos)

    # --- verifier block -------------------------------------------------------------------------------------

    def _verifier_texts(self, verifier_info: Sequence[str | None] | Any) -> list[str | None]:
        """Validate the K texts; blank ones become None (= absent from every context)."""
        infos = list(verifier_info)
        if len(infos) != len(self.reward_keys):
            raise ValueError(f"{len(infos)} verifier-info texts for {len(self.reward_keys)} rewards {self.reward_keys}")
        texts: list[str | None] = []
        for key, info in zip(self.reward_keys, infos, strict=True):
            if info is not None and not isinstance(info, str):
                raise TypeError(
                    f"verifier information for reward {key!r} must be a string or None, got {type(info).__name__}"
                )
            texts.append(info.strip() if info is not None and info.strip() else None)
        return texts

    def _block(self, texts: Sequence[str | None], skip: int | None, order: Sequence[int]) -> str:
        """The verifier block with the present texts in ``order``, except ``skip``; "" when none is left."""
        items = [
            self.verifier_item_template.format(name=self.reward_keys[k], info=texts[k])
            for k in order
            if texts[k] is not None and k != skip
        ]
        return "\n\n".join([self.verifier_header, *items]) if items else ""

    # --- prompt rendering -----------------------------------------------------------------------------------

    def _renderer(self, prompt: Any) -> _Renderer:
        """A function block → context token ids, for either prompt form."""
        if _looks_like_messages(prompt):
            return self._chat_renderer([dict(message) for message in prompt])
        return self._token_id_renderer(_as_token_ids(prompt, "prompt"))

    def _chat_renderer(self, messages: list[dict[str, Any]]) -> _Renderer:
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        if last_user is None:
            raise ValueError(f"the prompt has no user turn (roles: {[m.get('role') for m in messages]})")
        content = messages[last_user].get("content")
        if not isinstance(content, str):
            raise TypeError(f"the last user turn's content must be a string, got {type(content).__name__}")

        def render(block: str) -> tuple[int, ...]:
            with_block = [dict(m) for m in messages]
            if block:
                with_block[last_user]["content"] = f"{content}\n\n{block}"
            return self._tokenize(self._apply_template(with_block))

        return render

    def _token_id_renderer(self, prompt_ids: tuple[int, ...]) -> _Renderer:
        tail = self._learn_user_turn_tail()
        tail_ids = self._user_turn_tail_ids
        if len(prompt_ids) > len(tail_ids) and prompt_ids[len(prompt_ids) - len(tail_ids) :] == tail_ids:
            head_ids = prompt_ids[: len(prompt_ids) - len(tail_ids)]

            def splice(block: str) -> tuple[int, ...]:
                if not block:
                    return prompt_ids
                block_ids = self._tokenize(f"\n\n{block}")
                if self._decode(block_ids) != f"\n\n{block}":  # a tokenizer that adds a prefix space, say
                    return self._tokenize(f"{self._decode(head_ids)}\n\n{block}{tail}")
                return head_ids + block_ids + tail_ids

            return splice
        text = self._decode(prompt_ids)
        if not text.endswith(tail):
            raise ValueError(
                f"the prompt's token ids do not end with the end of a user turn and the generation prompt "
                f"({tail!r}, learnt from the chat template with chat_template_kwargs={self.chat_template_kwargs}; "
                f"they must be those the rollout used, verl's data.apply_chat_template_kwargs); "
                f"decoded ending: {text[-80:]!r}"
            )
        head = text[: len(text) - len(tail)]

        def render(block: str) -> tuple[int, ...]:
            return self._tokenize(f"{head}\n\n{block}{tail}" if block else text)

        return render

    def _learn_user_turn_tail(self) -> str:
        """Text after a user turn's content up to the end of the generation prompt, from a probe conversation.

        E.g. ``"<|im_end|>\\n<|im_start|>assistant\\n"`` for ChatML templates.
        """
        if self._user_turn_tail is None:
            probe = [{"role": "user", "content": _PROBE_CONTENT}]
            with_prompt = self._apply_template(probe)
            without_prompt = self._apply_template(probe, add_generation_prompt=False)
            if not with_prompt.startswith(without_prompt) or _PROBE_CONTENT not in without_prompt:
                raise ValueError("cannot locate the user turn's end in this chat template; pass chat messages instead")
            end_of_turn = without_prompt[without_prompt.rindex(_PROBE_CONTENT) + len(_PROBE_CONTENT) :]
            self._user_turn_tail = end_of_turn + with_prompt[len(without_prompt) :]
            self._user_turn_tail_ids = self._tokenize(self._user_turn_tail)
        return self._user_turn_tail

    def _apply_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.chat_template_kwargs
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
        return text

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _tokenize(self, text: str) -> tuple[int, ...]:
        # The rendered template already holds its special tokens (as apply_chat_template(tokenize=True) assumes).
        return tuple(int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # --- token budget ---------------------------------------------------------------------------------------

    def _fit_to_budget(
        self, render: _Renderer, texts: list[str | None], included: list[int], response_length: int
    ) -> tuple[list[str | None], tuple[bool, ...]]:
        """Cut the verifier texts to the largest common token cap at which every context fits the budget.

        Returns:
            The (possibly truncated) texts and K flags of which were cut.
        """
        not_truncated = (False,) * len(texts)
        if not included or self._fits(render, texts, included, response_length):
            return texts, not_truncated
        text_ids = {k: self._tokenize(texts[k] or "") for k in included}
        if not self._fits(render, self._capped(texts, text_ids, 0), included, response_length):
            shortest = self._longest_context(render, self._capped(texts, text_ids, 0), included)
            raise ContextOverBudget(
                f"replay context does not fit max_context_tokens={self.max_context_tokens}: prompt + verifier "
                f"block with every verifier text cut to {self.truncation_marker!r} is {shortest} tokens, plus "
                f"{response_length} response tokens; raise mrtpo.replay.max_context_tokens"
            )
        # Binary search on the cap (context length grows with it): fits at `low`, does not at `high`.
        low, high = 0, max(len(ids) for ids in text_ids.values())
        while high - low > 1:
            middle = (low + high) // 2
            if self._fits(render, self._capped(texts, text_ids, middle), included, response_length):
                low = middle
            else:
                high = middle
        truncated = tuple(k in text_ids and len(text_ids[k]) > low for k in range(len(texts)))
        return self._capped(texts, text_ids, low), truncated

    def _capped(self, texts: list[str | None], text_ids: dict[int, tuple[int, ...]], cap: int) -> list[str | None]:
        """Texts with more than ``cap`` tokens cut to their first ``cap`` tokens plus the marker."""
        capped = list(texts)
        for k, ids in text_ids.items():
            if len(ids) > cap:
                kept = self._decode(ids[:cap])
                # A cut inside a multi-byte character decodes to U+FFFD; drop it rather than show garbage.
                capped[k] = kept.rstrip("\ufffd") + self.truncation_marker
        return capped

    def _fits(self, render: _Renderer, texts: list[str | None], included: list[int], response_length: int) -> bool:
        if self.max_context_tokens is None:
            return True
        return self._longest_context(render, texts, included) + response_length <= self.max_context_tokens

    def _longest_context(self, render: _Renderer, texts: list[str | None], included: list[int]) -> int:
        """Token length of the longest of C and the C_-k (usually C; tokenization is not strictly additive)."""
        blocks = [self._block(texts, None, included), *(self._block(texts, k, included) for k in included)]
        return max(len(render(block)) for block in blocks)


def group_constant_flags(
    prompts: Sequence[Any], verifier_infos: Sequence[Sequence[str | None]]
) -> list[tuple[bool, ...]]:
    """(bs, K): whether each row's text k is the same for every row with the same prompt (its group).

    Texts are compared after ``strip`` (blank = absent). A group of one row has every text constant. Computed
    over the whole batch by the driver (``build_request``), so that a data-parallel split that cuts a group
    does not change the verifier order, hence the contexts.
    """
    texts = [[_stripped(info) for info in row] for row in verifier_infos]
    groups: dict[Any, list[int]] = {}
    for row, prompt in enumerate(prompts):
        groups.setdefault(_prompt_key(prompt), []).append(row)
    constant: list[tuple[bool, ...]] = [()] * len(prompts)
    for rows in groups.values():
        width = len(texts[rows[0]])
        flags = tuple(len({texts[row][k] for row in rows}) == 1 for k in range(width))
        for row in rows:
            constant[row] = flags
    return constant


def _stripped(info: Any) -> Any:
    return info.strip() or None if isinstance(info, str) else info


def verifier_order(texts: Sequence[str | None], group_constant: Sequence[bool] | None = None) -> list[int]:
    """The order of the present verifier texts inside the block: part of the context definition.

    Rule: texts identical for every response of the group first, then the others; within each part the longest
    text (in characters) first, ties in reward order. Why: a leave-one-out ``C_-k`` shares with ``C`` every text
    placed before ``k``, and a group-constant text placed early is shared by the whole group, so this order
    maximises the prefix the replay computes once (``prefix_tree.py``). Both replay paths (shared and unshared)
    use the same contexts, hence the same order.

    Args:
        texts: K texts, None = absent.
        group_constant: K flags; None = every text is constant (a lone response).

    Returns:
        Indices of the present texts, in block order.
    """
    constant = [True] * len(texts) if group_constant is None else list(group_constant)
    if len(constant) != len(texts):
        raise ValueError(f"{len(constant)} group-constant flags for {len(texts)} verifier texts")
    present = [k for k, text in enumerate(texts) if text is not None]
    return sorted(present, key=lambda k: (not constant[k], -len(texts[k] or ""), k))


def _prompt_key(prompt: Any) -> Any:
    """A hashable identity of a prompt (chat messages or token ids), to find the rows of one group."""
    if _looks_like_messages(prompt):
        return tuple(tuple(sorted((str(key), str(value)) for key, value in dict(m).items())) for m in prompt)
    return _as_token_ids(prompt, "prompt")


def _looks_like_messages(prompt: Any) -> bool:
    if isinstance(prompt, str | bytes):
        raise TypeError("the prompt must be chat messages or token ids, not a string")
    try:
        first = next(iter(prompt))
    except StopIteration:
        raise ValueError("the prompt is empty") from None
    except TypeError:
        raise TypeError(f"the prompt must be chat messages or token ids, got {type(prompt).__name__}") from None
    return isinstance(first, Mapping)


def _as_token_ids(ids: Any, what: str) -> tuple[int, ...]:
    """A list / numpy array / 1-D tensor of integer ids → a tuple of Python ints."""
    values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if not all(isinstance(value, Integral) and not isinstance(value, bool) for value in values):
        raise TypeError(f"{what} must be a flat sequence of integer token ids")
    return tuple(int(value) for value in values)
