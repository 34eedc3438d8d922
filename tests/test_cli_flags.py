"""The flags of `dcoco gateway` and `dcoco worker` come from their settings: one flag per
setting, its choices the setting's own, and a flag wins over its DCOCO_* variable."""

import argparse

import pytest

from cli_checks import one_line
from dcoco.cli import build_parser, main
from dcoco.commands.args import choices_of
from dcoco.settings import GatewaySettings, WorkerSettings, settings_from
from dcoco.shared.errors import UsageError
from dcoco.shared.options import Mode, Precision, Rule


def flags_of(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        option: action
        for action in sub.choices[command]._actions
        for option in action.option_strings
    }


@pytest.mark.parametrize(
    ("command", "settings"), [("gateway", GatewaySettings), ("worker", WorkerSettings)]
)
def test_every_setting_is_a_flag(command: str, settings: type[GatewaySettings]) -> None:
    flags = flags_of(command)
    for name, field in settings.model_fields.items():
        action = flags[f"--{name.replace('_', '-')}"]
        assert f"DCOCO_{name.upper()}" in (action.help or "")
        if field.annotation is bool:
            assert f"--no-{name.replace('_', '-')}" in flags
        else:
            assert action.choices == choices_of(field.annotation)


def test_choices_are_the_enums_values() -> None:
    flags = flags_of("worker")
    assert flags["--mode"].choices == [m.value for m in Mode]
    assert flags["--rule"].choices == [r.value for r in Rule]
    assert flags["--precision"].choices == [p.value for p in Precision]
    assert flags["--engine"].choices == ["torch", "vllm", "instant"]
    assert flags_of("serve")["--mode"].choices == [m.value for m in Mode]
    assert flags_of("generate")["--rule"].choices == [r.value for r in Rule]


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DCOCO_MODE", "dcoco")
    monkeypatch.setenv("DCOCO_MAX_BATCH_SIZE", "8")
    argv = ["worker", "--mode", "dflash", "--no-adaptive", "--vllm-args", '{"seed": 1}']
    settings = settings_from(WorkerSettings, build_parser().parse_args(argv))
    assert settings.mode is Mode.DFLASH
    assert settings.max_batch_size == 8  # no flag: the variable
    assert settings.adaptive is False
    assert settings.vllm_args == {"seed": 1}
    gateway = build_parser().parse_args(["gateway", "--api-keys", "a, b", "--port", "9000"])
    assert settings_from(GatewaySettings, gateway).api_keys == ("a", "b")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", "--max-batch-size", "0"], "max_batch_size: Input should be greater than"),
        (["gateway", "--port", "70000"], "port: Input should be less than"),
        (["gateway", "--queue-timeout-s", "soon"], "queue_timeout_s: Input should be a valid"),
        (["worker", "--threads", "-1"], "threads: Input should be greater than or equal to 0"),
    ],
)
def test_a_bad_value_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UsageError, match=message):
        settings_from(
            WorkerSettings if argv[0] == "worker" else GatewaySettings,
            build_parser().parse_args(argv),
        )
    assert main(argv) == 1
    one_line(capsys.readouterr().err, message)
