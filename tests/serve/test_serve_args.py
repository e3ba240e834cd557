"""`agentrl serve` takes the model as `vllm serve` does (positional) or as ``--model``, and defaults to the model
`agentrl fit` defaults to."""

from __future__ import annotations

import inspect

import httpx
import pytest

from agentrl.models.loading import SMOLLM2
from agentrl.models.policy import Policy
from agentrl.serve.server import parse_args
from tests.support.server import start_server


def test_no_model_defaults_to_the_model_of_agentrl_fit() -> None:
    fit_default = inspect.signature(Policy.__init__).parameters["model"].default
    assert parse_args([]).model == SMOLLM2 == fit_default
    assert parse_args(["--port", "9"]).model == SMOLLM2


@pytest.mark.parametrize("argv,model", [(["tiny-random"], "tiny-random"), (["--model", "tiny-random"], "tiny-random"),
                                         (["tiny-random", "--model", "tiny-random", "--port", "9"], "tiny-random")])
def test_the_model_is_positional_or_an_option(argv: list[str], model: str) -> None:
    assert parse_args(argv).model == model


def test_two_different_models_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["tiny-random", "--model", "smollm2-135m-instruct"])
    assert exc.value.code == 2
    assert "given twice" in capsys.readouterr().err


def test_a_server_started_with_a_positional_model_serves_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(tmp_path, model="tiny-random", positional=True)
    try:
        models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "tiny-random"
        assert "--model" not in " ".join(server.proc.args)  # type: ignore[arg-type]
    finally:
        server.stop()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_body_limit_must_be_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--max-request-mb", value])
    assert "--max-request-mb must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv,env,message", [
    (["--api-key", ""], {}, "--api-key is empty"),
    (["--api-key", "  "], {}, "--api-key is empty"),
    ([], {"AGENTRL_API_KEY": ""}, "$AGENTRL_API_KEY is set but empty"),
])
def test_an_empty_api_key_is_refused_not_taken_as_no_key(argv: list[str], env: dict[str, str], message: str,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRL_API_KEY", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        parse_args(["tiny-random", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_key_from_the_option_or_the_environment_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_API_KEY", "from-env")
    assert parse_args(["tiny-random"]).api_key == "from-env"
    assert parse_args(["tiny-random", "--api-key", "given"]).api_key == "given"
    monkeypatch.delenv("AGENTRL_API_KEY")
    assert parse_args(["tiny-random"]).api_key is None


def test_bf16_weights_are_refused_on_a_cpu_without_native_bf16(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.models import precision

    monkeypatch.delenv(precision.ALLOW_SLOW_BF16, raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_support",
                        lambda: precision.Bf16Support(False, "CPU AMD EPYC 7B13 has no native bf16"))
    with pytest.raises(SystemExit) as exc:
        parse_args(["tiny-random", "--dtype", "bfloat16"])
    assert exc.value.code == 2
    assert "--dtype is bfloat16, but CPU AMD EPYC 7B13 has no native bf16" in capsys.readouterr().err
    assert parse_args(["tiny-random"]).dtype == "float32"  # the default is never refused
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: precision.Bf16Support(True, "CPU X has avx512_bf16"))
    assert parse_args(["tiny-random", "--dtype", "bfloat16"]).dtype == "bfloat16"
