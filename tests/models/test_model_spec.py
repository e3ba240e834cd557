"""Model names are resolved before any weights load: a wrong one fails at once, naming it."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import huggingface_hub.constants as hf_constants
import pytest

from agentrl.models.loading import ModelLoadError, check_model_spec


def test_short_names_files_and_folders_resolve(tmp_path: Path) -> None:
    assert check_model_spec("tiny-random") == "tiny"
    assert check_model_spec("smollm2-135m-instruct") == "smollm2"
    (tmp_path / "config.json").write_text("{}")
    assert check_model_spec(str(tmp_path)) == "folder"


@pytest.mark.parametrize("spec,message", [
    ("./no/such/folder", "not a hub id"),
    ("a/b/c", "not a hub id"),
    ("/tmp/missing-model.gguf", "GGUF file not found"),
])
def test_malformed_or_missing_names_fail(spec: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message) as exc:
        check_model_spec(spec)
    assert spec in str(exc.value)


def test_an_uncached_hub_id_fails_at_once_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: asked.append(a[0]))
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE") as exc:
        check_model_spec("HuggingFaceTB/SmolLM2-135M-Instruc")
    assert "HuggingFaceTB/SmolLM2-135M-Instruc" in str(exc.value)
    assert asked == []  # the hub was not asked


def test_an_uncached_hub_id_the_hub_cannot_provide_fails_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)

    def unreachable(repo_id: str, timeout: float | None = None) -> None:
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    with pytest.raises(ModelLoadError, match="hub cannot provide it .ConnectionError: Name or service not known"):
        check_model_spec("HuggingFaceTB/SmolLM2-135M-Instruc")
