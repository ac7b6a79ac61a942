"""The repository's root folder, for tests that run its files or read its docs."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO = str(REPO_ROOT)
