"""Shared fixtures: the repository's replay scenarios and the `kvsched` binary to compare with.

The binary is `$KVSCHED_BIN` when set (CI sets it: then a missing binary is an error, not a
skip), else the first of `target/{debug,release}/kvsched` under `$CARGO_TARGET_DIR` or the
repository's `target/`.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
SCENARIOS = REPO / "crates" / "kvsched-cli" / "tests" / "scenarios"


def scenario_files() -> list[pathlib.Path]:
    files = sorted(p for p in SCENARIOS.glob("*.json") if not p.name.endswith(".expected.json"))
    assert files, f"no scenarios under {SCENARIOS}"
    return files


def _find_bin() -> pathlib.Path | None:
    explicit = os.environ.get("KVSCHED_BIN")
    if explicit:
        p = pathlib.Path(explicit)
        assert p.is_file(), f"KVSCHED_BIN={explicit} is not a file"
        return p
    roots = [pathlib.Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    roots.append(REPO / "target")
    for root in roots:
        for profile in ("debug", "release"):
            p = root / profile / "kvsched"
            if p.is_file():
                return p
    return None


class Cli:
    """Runs `kvsched replay -` on JSON text: (exit code, stdout bytes, stderr text)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def replay(self, text: bytes, *args: str) -> tuple[int, bytes, str]:
        r = subprocess.run(
            [str(self.path), "replay", *args, "-"], input=text, capture_output=True, timeout=60
        )
        return r.returncode, r.stdout, r.stderr.decode()


@pytest.fixture(scope="session")
def cli() -> Cli:
    p = _find_bin()
    if p is None:
        pytest.skip("no kvsched binary (build it with `cargo build -p kvsched-cli` or set KVSCHED_BIN)")
    return Cli(p)
