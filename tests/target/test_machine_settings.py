"""The machine settings as config keys and CLI flags: ``threads`` (1 to 1024, or auto) and ``prepack`` (true, false
or auto); a bad value is refused naming the key or flag, on the command line in one error line before any model
loads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specframe.config import load_config
from specframe.errors import ConfigError


@pytest.mark.parametrize("bad", [0, -1])
def test_threads_below_one_rejected(bad, tmp_path):
    with pytest.raises(ConfigError, match=r"threads must be in \[1, 1024\] or auto"):
        load_config(None, threads=bad)
    f = tmp_path / "c.yaml"
    f.write_text(f"threads: {bad}\n")
    with pytest.raises(ConfigError, match="threads"):
        load_config(f)


def test_threads_and_prepack_accepted(tmp_path):
    assert load_config(None).threads == "auto" and load_config(None).prepack == "auto"
    assert load_config(None, threads="auto").threads == "auto"
    assert load_config(None, threads=2).threads == 2
    for value, want in ((True, True), (False, False), ("auto", "auto")):
        assert load_config(None, prepack=value).prepack == want
    f = tmp_path / "c.yaml"
    f.write_text("threads: 3\nprepack: false\n")
    cfg = load_config(f)
    assert (cfg.threads, cfg.prepack) == (3, False)
    with pytest.raises(ConfigError, match="prepack"):
        load_config(None, prepack="maybe")
    with pytest.raises(ConfigError, match="threads"):
        load_config(None, threads="many")


def test_threads_true_is_rejected(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("threads: yes\n")
    with pytest.raises(ConfigError, match="threads"):
        load_config(f)


@pytest.mark.parametrize("args, needle", [(["--threads", "x"], "--threads"), (["--threads", "0"], "--threads"),
                                          (["--threads", "-2"], "--threads"), (["--prepack", "maybe"], "--prepack")])
def test_cli_bad_machine_flags(args, needle, no_model_load):
    from specframe import cli

    result = CliRunner().invoke(cli.app, ["generate", "hello", *args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert needle in lines[0] and repr(args[-1]) in lines[0]
    assert "Traceback" not in result.output
