"""What the Python client scripts share (py1_client.py, py2_client.py, restart_client.py)."""

from __future__ import annotations

import json


def text_json(result) -> object:
    """A tool result's first text content, as JSON when it is JSON."""
    text = result.content[0].text
    try:
        return json.loads(text)
    except ValueError:
        return text
