"""Swap module attributes of vLLM for the length of a block, as the stages need.

The stages run vLLM's own layers and loaders outside a distributed run: the tensor
parallel rank and size are answered by the stage, and a kernel can be stood in for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


@contextmanager
def replaced(module: ModuleType, **attrs: object) -> Iterator[None]:
    """Set ``module.<name> = value`` for each keyword whose value is not None, and put
    the originals back when the block ends (also on an exception)."""
    saved = {name: getattr(module, name) for name, value in attrs.items() if value is not None}
    try:
        for name in saved:
            setattr(module, name, attrs[name])
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
