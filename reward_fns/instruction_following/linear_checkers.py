r"""Linear-time ``check_following`` for the checkers whose own is quadratic in the response.

Each class here subclasses the library's checker (its description and arguments are the
library's own) and replaces only ``check_following`` with one that gives the same verdict on
every response in time linear in its length. IFBench's ``format:newline`` and
``format:line_indent`` remove list items one at a time (``list.remove`` in a loop), which costs
O(lines²) on an answer of many short paragraphs. IFEval's
``detectable_content:number_placeholders`` counts ``re.findall(r"\[.*?\]", ...)``, which from
every ``[`` scans to the end of its line when no ``]`` follows: O(length²) on a long line of ``{[(``.
``tests/reward_fns/test_instruction_following_linear_checkers_on_cpu.py`` holds each rewrite
against the library's method on generated responses.
"""

from __future__ import annotations

import itertools
import re
import string
from collections import defaultdict, deque

from eval_framework.tasks.ifeval import instructions as ifeval_instructions  # type: ignore[import-untyped]
from ifbench import instructions  # type: ignore[import-untyped]

_PUNCTUATION_REMOVED = str.maketrans("", "", string.punctuation)


class NewLineWordsLinear(instructions.NewLineWordsChecker):  # type: ignore[misc]
    """``format:newline``: every word on a line of its own."""

    def check_following(self, value: str) -> bool:
        """The library's own check on the response with its runs of newlines made single after removing punctuation.

        That changes neither the word count nor the non-empty lines, and leaves the library's empty-line removal
        loop (one ``list.remove`` per empty line) at most one empty line to remove.
        """
        return bool(super().check_following(re.sub(r"\n+", "\n", value.translate(_PUNCTUATION_REMOVED))))


class IndentStairsLinear(instructions.IndentStairsChecker):  # type: ignore[misc]
    """``format:line_indent``: each line indented by more spaces than the one before."""

    def check_following(self, value: str) -> bool:
        """As the library, including which blank lines its remove-while-iterating loop keeps.

        The library walks the lines with a ``for`` loop and, on a blank line, removes the *first*
        line equal to it; the removal shifts the list, so the loop then skips the line after.
        Every line at or before the loop's position that is equal to the blank one is a candidate,
        earliest first, and lines past the position are never removed. So one pass that keeps, per
        blank text, a queue of the indices passed so far reproduces the removals exactly.
        """
        lines = value.split("\n")
        passed: defaultdict[str, deque[int]] = defaultdict(deque)
        removed: set[int] = set()
        position = 0
        while position < len(lines):
            line = lines[position]
            passed[line].append(position)
            if line.strip():
                position += 1
                continue
            removed.add(passed[line].popleft())
            if position + 1 < len(lines):  # skipped by the loop, but still a candidate for later removals
                passed[lines[position + 1]].append(position + 1)
            position += 2
        kept = [line for index, line in enumerate(lines) if index not in removed]
        indents = [len(line) - len(line.lstrip(" ")) for line in kept]
        return all(later > earlier for earlier, later in itertools.pairwise(indents))


class PlaceholdersLinear(ifeval_instructions.PlaceholderChecker):  # type: ignore[misc]
    """``detectable_content:number_placeholders``: at least N placeholders in square brackets."""

    def check_following(self, value: str) -> bool:
        """As the library: the non-overlapping ``[...]`` with no newline inside, at least N of them."""
        return count_placeholders(value) >= self._num_placeholders  # type: ignore[no-any-return]


def count_placeholders(text: str) -> int:
    r"""``len(re.findall(r"\[.*?\]", text))`` in one forward pass.

    From a ``[``, the pattern matches up to the first ``]`` unless a newline comes first; then no
    ``[`` before that newline can match either. Every search starts past the previous one (the
    first ``]`` after a ``[`` is kept while later ``[`` come before it), so no character is read twice.
    """
    count, position, closing = 0, 0, -1
    while (opening := text.find("[", position)) >= 0:
        if closing <= opening:
            closing = text.find("]", opening + 1)
            if closing < 0:
                return count
        newline = text.find("\n", opening + 1, closing)
        if newline >= 0:
            position = newline + 1
            continue
        count += 1
        position = closing + 1
    return count


REWRITES: dict[str, type] = {
    "detectable_content:number_placeholders": PlaceholdersLinear,
    "format:newline": NewLineWordsLinear,
    "format:line_indent": IndentStairsLinear,
}
"""Instruction id to the linear-time checker that replaces the library's."""
