"""A FastAPI app with only the web studio mounted, for the studio's browser tests until `encoderkit serve` lands.

ENCODERKIT_STUDIO_MODELS: JSON {"name": ["model directory", ["kind", ...]], ...}; the first is the default.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from fastapi import FastAPI

from encoderkit.server.studio import mount_studio
from helpers import FakeRegistry

app = FastAPI()
_models = json.loads(os.environ["ENCODERKIT_STUDIO_MODELS"])
mount_studio(app, FakeRegistry({name: (Path(path), set(kinds)) for name, (path, kinds) in _models.items()}))
