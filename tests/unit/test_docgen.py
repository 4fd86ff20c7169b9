"""The generated docs match the declarations they are made from."""

from __future__ import annotations

import pytest

from exporter.docgen.__main__ import ROOT, generated, main, update


def test_every_generated_part_is_current() -> None:
    stale = [rel for rel, text in generated().items() if (ROOT / rel).read_text() != text]
    assert stale == [], "run: make docs"
    assert main(["--check"]) == 0


def test_a_stale_block_is_found_and_a_missing_one_named() -> None:
    text = "a\n<!-- BEGIN generated:x -->\nold\n<!-- END generated:x -->\nb\n"
    assert update(text, {"x": "new"}) == "a\n<!-- BEGIN generated:x -->\nnew\n<!-- END generated:x -->\nb\n"
    with pytest.raises(ValueError, match="generated:y"):
        update(text, {"y": "new"})
