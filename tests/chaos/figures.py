"""What the chaos tests measured, kept for docs/develop.md's table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIGURES = Path(__file__).resolve().parents[2] / "test-artifacts" / "chaos"


def record_figures(name: str, figures: dict[str, Any]) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{name}.json").write_text(json.dumps(figures, indent=2))
    print(f"\n{name}: {json.dumps(figures)}")
