import json
from pathlib import Path

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str, **changes) -> str:
    """A recorded progress event as JSON text, with top-level fields replaced."""
    data = json.loads((RECORDED / f"{name}.json").read_text())
    data.update(changes)
    return json.dumps(data)
