"""Prefix tree over the replay's contexts: which token prefixes are computed once and shared.

Every pass of the replay is ``context + response`` (a full context ``C`` or a leave-one-out ``C_-k``). By
construction (``contexts.py``) the contexts of one response share the rendered prompt up to the verifier
block, the responses of a GRPO group share that same prompt, and a leave-one-out ``C_-k`` shares with ``C``
every verifier text placed before ``k``. The tree is built on the contexts' own token ids (each context is
tokenized whole, exactly as in the unshared path), so a shared prefix is shared *token for token*: where a
tokenizer merges text across the prompt/verifier boundary differently for two contexts, the tree simply
branches earlier for them — that row falls back to sharing less (or nothing), never to different tokens.

A node holds the tokens ``context[:depth]`` common to every pass below it; its key/value cache is computed
once, by running ``tokens`` (the part below the parent's depth) against the parent's cache. A pass is a
*remainder* of the deepest node it reaches: ``context[depth:] + response`` is run against that node's
cache. The root has depth 0 and no cache; its remainders are plain unshared passes. A branch becomes a node
only if at least two passes share at least ``min_shared_tokens`` tokens beyond the parent (each node costs one
more, smaller forward call). ``depth`` is capped at ``len(context) - 1`` for every pass below, so each
remainder starts with at least one context token: the hidden state predicting the first response token.

Lower bound: :func:`distinct_prefix_tokens` counts the tree's nodes at token granularity (every distinct
context prefix once) plus each pass's response — the fewest tokens any prefix-sharing replay can run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = ["PassLike", "PrefixNode", "build_prefix_tree", "distinct_prefix_tokens", "two_level_tree"]


class PassLike(Protocol):
    """One sequence to replay: ``context + response``."""

    @property
    def context(self) -> Sequence[int]: ...

    @property
    def response(self) -> Sequence[int]: ...


@dataclass
class PrefixNode:
    """A shared prefix: ``depth`` tokens whose cache serves ``remainders`` and ``children``.

    Attributes:
        parent_depth: tokens cached by the parent node (0 for the root and its children).
        depth: tokens cached at this node; every pass below starts with the same ``depth`` tokens.
        tokens: ``context[parent_depth:depth]``, the tokens this node's own forward call runs.
        remainders: passes run against this node's cache (the root's: unshared passes).
        children: deeper shared prefixes.
    """

    parent_depth: int
    depth: int
    tokens: tuple[int, ...]
    remainders: list[PassLike] = field(default_factory=list)
    children: list[PrefixNode] = field(default_factory=list)

    def walk(self) -> list[PrefixNode]:
        """This node and its descendants, depth first (the order in which they run)."""
        nodes = [self]
        for child in self.children:
            nodes.extend(child.walk())
        return nodes


def build_prefix_tree(passes: Sequence[PassLike], min_shared_tokens: int) -> PrefixNode:
    """The prefix tree of ``passes`` (see the module docstring); passes keep their relative order in each node.

    Args:
        passes: sequences with non-empty contexts.
        min_shared_tokens: fewest tokens (beyond the parent) that two or more passes must share to get a node.
    """
    root = PrefixNode(0, 0, ())
    _grow(root, list(passes), max(1, min_shared_tokens))
    return root


def _grow(node: PrefixNode, passes: list[PassLike], min_shared_tokens: int) -> None:
    buckets: dict[int, list[PassLike]] = {}
    for sequence in passes:
        if len(sequence.context) - 1 > node.depth:  # room for one more shared token
            buckets.setdefault(sequence.context[node.depth], []).append(sequence)
        else:
            node.remainders.append(sequence)
    for bucket in buckets.values():
        depth = _shared_depth(bucket) if len(bucket) > 1 else node.depth
        if depth - node.depth < min_shared_tokens:
            node.remainders.extend(bucket)
            continue
        child = PrefixNode(node.depth, depth, tuple(bucket[0].context[node.depth : depth]))
        node.children.append(child)
        _grow(child, bucket, min_shared_tokens)


def _shared_depth(bucket: list[PassLike]) -> int:
    """Longest common context prefix of the bucket, leaving every context at least one token beyond it."""
    # The common prefix of a set is that of its lexicographic minimum and maximum.
    contexts = [tuple(sequence.context) for sequence in bucket]
    common = common_prefix_length(min(contexts), max(contexts))
    return min(common, min(len(context) for context in contexts) - 1)


def common_prefix_length(first: Sequence[int], second: Sequence[int]) -> int:
    """Number of leading tokens two id sequences share."""
    length = min(len(first), len(second))
    differs = np.asarray(first[:length], dtype=np.int64) != np.asarray(second[:length], dtype=np.int64)
    return int(differs.argmax()) if differs.any() else length


def distinct_prefix_tokens(passes: Sequence[PassLike]) -> int:
    """Lower bound on replayed tokens with prefix sharing: distinct context prefixes + every pass's response.

    Every distinct prefix ``context[:i + 1]`` (a node of the token-level trie) is one token some pass must run;
    responses are never shared (each is conditioned on a different context).
    """
    # Sorted, each context adds the prefixes it does not share with its predecessor (the trie's new nodes).
    contexts = sorted(tuple(sequence.context) for sequence in passes)
    distinct = sum(
        len(context) - (common_prefix_length(context, previous) if index else 0)
        for index, (context, previous) in enumerate(zip(contexts, [(), *contexts[:-1]], strict=True))
    )
    return distinct + sum(len(sequence.response) for sequence in passes)


def two_level_tree(tree: PrefixNode) -> PrefixNode:
    """The tree cut to two levels of model calls: *anchor* prefixes computed from their first token, then every pass.

    The root's children become the anchors, each with ``parent_depth`` 0 and its whole prefix as ``tokens``; every
    pass runs against the cache of its deepest anchor (or unshared, at the root). The anchors are chosen among the
    tree's nodes to feed the fewest tokens: an anchor costs its ``depth`` tokens and saves ``depth - d`` on each pass
    below it that would otherwise continue an anchor of depth ``d`` (found exactly by recursion over the tree, each
    node with each depth of the anchors above it). Fewer tokens are never fed than by the whole tree, but two levels
    of calls (as few as the budgets allow in each) replace one level per tree level.
    """
    memo: dict[tuple[int, int], tuple[int, bool]] = {}

    def pass_tokens(node: PrefixNode, depth: int) -> int:
        return sum(len(sequence.context) + len(sequence.response) - depth for sequence in node.remainders)

    def cost(node: PrefixNode, anchor_depth: int) -> int:
        """Tokens fed for ``node``'s subtree when the nearest anchor above has ``anchor_depth`` tokens."""
        key = (id(node), anchor_depth)
        if key not in memo:
            stay = pass_tokens(node, anchor_depth) + sum(cost(child, anchor_depth) for child in node.children)
            anchored = node.depth + pass_tokens(node, node.depth) + sum(cost(c, node.depth) for c in node.children)
            memo[key] = (anchored, True) if anchored < stay else (stay, False)
        return memo[key][0]

    root = PrefixNode(0, 0, (), list(tree.remainders))

    def collect(node: PrefixNode, anchor: PrefixNode) -> None:
        cost(node, anchor.depth)
        if memo[(id(node), anchor.depth)][1]:
            anchor = PrefixNode(0, node.depth, tuple(_first_pass(node).context[: node.depth]))
            root.children.append(anchor)
        anchor.remainders.extend(node.remainders)
        for child in node.children:
            collect(child, anchor)

    for child in tree.children:
        collect(child, root)
    return root


def _first_pass(node: PrefixNode) -> PassLike:
    """Any pass below ``node`` (every node has at least two)."""
    return node.remainders[0] if node.remainders else _first_pass(node.children[0])
