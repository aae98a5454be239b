"""YAML text to Python values for scenario, profile, sweep and plan files: PyYAML's safe loader, run by
libyaml's C parser when PyYAML was built with it (the pure-Python parser is several times slower, and a
run reads its scenario and profile files every time), else by the pure-Python one. Same values, same
errors (``yaml.YAMLError``).

Bounded before anything is built: the document is composed into nodes first (aliases there are shared
nodes, so a billion-laughs file is a few dozen of them), and one whose values, aliases expanded, exceed
``MAX_VALUES`` or whose nesting exceeds ``MAX_DEPTH`` (or whose aliases refer to themselves) is refused
with ``YAMLLimitError`` — never expanded into memory. So is a mapping that gives one key twice.
"""

from __future__ import annotations

from typing import Any

import yaml

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_VALUES = 200_000
"""Scalars, lists and mappings a document may hold once its aliases are expanded (a shipped scenario holds
a few hundred; a rate curve of thousands of points still fits)."""
MAX_DEPTH = 64
"""Nesting a document may have: far more than any scenario section needs, far less than recursion limits."""


class YAMLLimitError(yaml.YAMLError):
    """The document is too large or too deep once its aliases are expanded."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = None


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, in C where available, after checking the document's expanded size."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_limits(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def check_limits(root: yaml.Node) -> None:
    """Raise ``YAMLLimitError`` if ``root`` expands to more than ``MAX_VALUES`` values or ``MAX_DEPTH``
    levels. Each distinct node is measured once (aliases share nodes), so the check is linear in the text."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values once expanded, depth)
    on_path: set[int] = set()
    # An explicit stack: a hostile file's nesting must not meet Python's recursion limit here either.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            values, depth = 1, 1
            for child in _children(node):
                child_values, child_depth = sizes[id(child)]
                values += child_values
                depth = max(depth, child_depth + 1)
            if values > MAX_VALUES:
                raise YAMLLimitError(f"more than {MAX_VALUES:,} values once its aliases are expanded")
            if depth > MAX_DEPTH:
                raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels")
            sizes[key] = (values, depth)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YAMLLimitError("an alias refers to a value that contains it")
        if len(on_path) > MAX_DEPTH:
            raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels")
        on_path.add(key)
        if isinstance(node, yaml.MappingNode):
            _check_unique_keys(node)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _check_unique_keys(node: yaml.MappingNode) -> None:
    """A key given twice in one mapping is refused (YAML forbids it; PyYAML would keep the last silently, so
    ``seed: 0`` ... ``seed: 5`` ran with 5)."""
    seen: set[str] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if key_node.value in seen:
            raise YAMLLimitError(f"line {key_node.start_mark.line + 1}: key {key_node.value!r} is given twice in "
                                 "one mapping")
        seen.add(key_node.value)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
