"""The wrapper go.mod that builds a released module's commands, the warm path's promise (an
already built cache answers from its stamps without running anything), and what a failed
build tells the user."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from localkube import build, gomod, versions

UPSTREAM = """\
// A release's go.mod, trimmed: siblings live in directories of the same repository.
module example.org/big

go 1.24.0

toolchain go1.24.7

godebug default=go1.24

require (
\texample.org/api v0.0.0
\texample.org/client v0.0.0 // indirect
\tgithub.com/other/lib v1.2.3
)

require example.org/single v0.0.0

exclude github.com/other/lib v1.2.2

replace (
\texample.org/api => ./staging/api
\texample.org/client => ../client // a sibling one level up
\texample.org/sample => ./staging/sample
\texample.org/forbidden => ./FORBIDDEN_DEPENDENCY
\tgithub.com/other/lib v1.2.3 => github.com/fork/lib v1.2.4
)

replace example.org/single => ./single
"""


def wrapper() -> str:
    return gomod.wrapper_go_mod(
        wrapper="localkube.gregor.invalid/big",
        upstream=UPSTREAM,
        module="example.org/big",
        version="v1.5.0",
        sibling_version="v0.5.0",
    )


def test_wrapper_requires_the_release_and_pins_every_required_sibling() -> None:
    text = wrapper()
    assert "module localkube.gregor.invalid/big\n" in text
    assert "\nrequire example.org/big v1.5.0\n" in text
    for sibling in ("example.org/api", "example.org/client", "example.org/single"):
        assert f"\t{sibling} => {sibling} v0.5.0\n" in text
    assert "./" not in text  # no directory replacement survives, ../ included


def test_wrapper_drops_directory_replacements_of_modules_the_release_does_not_require() -> None:
    text = wrapper()
    assert "example.org/sample" not in text
    assert "FORBIDDEN" not in text


def test_wrapper_keeps_go_line_godebug_excludes_and_module_replacements() -> None:
    text = wrapper()
    assert "\ngo 1.24.0\n" in text
    assert "toolchain" not in text
    assert "godebug (\n\tdefault=go1.24\n)" in text
    assert "exclude (\n\tgithub.com/other/lib v1.2.2\n)" in text
    assert "\tgithub.com/other/lib v1.2.3 => github.com/fork/lib v1.2.4\n" in text


def test_parse_go_mod_flattens_blocks_and_drops_comments() -> None:
    directives = gomod.parse_go_mod(UPSTREAM)
    assert ("require", "example.org/client v0.0.0") in directives
    assert ("replace", "example.org/client => ../client") in directives
    assert ("module", "example.org/big") in directives


def _no_subprocess(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError(f"a warm call ran {args}")


def test_a_warm_cache_answers_from_its_stamps_without_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "localkube"
    for component in build.components():
        home = build.component_home(root, component)
        (home / "bin").mkdir(parents=True)
        for binary in component.binaries:
            (home / "bin" / binary.name).write_text("#!/bin/sh\n")
            (home / "bin" / binary.name).chmod(0o755)
        (home / ".stamp").write_text(build.fingerprint(component))
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    lines: list[str] = []

    binaries = build.ensure_binaries(tmp_path, log=lines.append)

    assert lines == []
    kubernetes = f"kubernetes-{versions.KUBERNETES_VERSION}"
    assert binaries.kubelet == root / kubernetes / "bin" / "kubelet"
    assert binaries.pause.parent.parent.name.startswith("pause-")


def test_a_changed_stamp_or_missing_binary_means_not_built(tmp_path: Path) -> None:
    (component,) = [c for c in build.components() if c.name == "pause"]
    home = build.component_home(tmp_path, component)
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "pause").write_text("")
    (home / "bin" / "pause").chmod(0o755)
    (home / ".stamp").write_text(build.fingerprint(component) + " ")
    assert not build.is_built(tmp_path, component)
    (home / ".stamp").write_text(build.fingerprint(component))
    assert build.is_built(tmp_path, component)
    (home / "bin" / "pause").unlink()
    assert not build.is_built(tmp_path, component)


def test_a_failed_build_names_the_component_and_quotes_the_tools_last_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    gcc = tools / "gcc"
    gcc.write_text("#!/bin/sh\necho 'pause.c:1: error: no compiler here' >&2\nexit 4\n")
    gcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")

    with pytest.raises(build.BuildError) as failure:
        build.ensure_binaries(tmp_path / "cache", log=lambda _: None)

    message = str(failure.value)
    assert f"building pause {versions.PAUSE_VERSION} failed" in message
    assert "exited 4" in message
    assert message.endswith("pause.c:1: error: no compiler here")
