"""The push probe's verdict (`agentrl.engines.push_check.compare`) on hand-made scores, and the config-time LoRA
refusal of the vLLM engine spec. The probe against a real server is in tests/vllm (opt-in tier)."""

from __future__ import annotations

import pytest

from agentrl.engines.push_check import PushCheck, PushNotApplied, TrainerScores, compare
from agentrl.engines.vllm import VLLMEngineSpec

CHECK = PushCheck(tokens=3, tolerance=0.25, margin=0.25)
URL = "http://127.0.0.1:9"
TRAINER = TrainerScores(logprobs=[-0.5, -1.0, -2.0], argmax=[5, 6, 7], lead=[1.0, 0.1, 2.0])


def test_within_the_tolerance_and_near_ties_pass() -> None:
    # token 1 differs from the trainer's argmax, but the trainer's top two are 0.1 apart: a near tie bf16 may flip
    result = compare(URL, "agentrl-v3", 3, [5, 9, 7], [-0.6, -0.9, -2.2], TRAINER, CHECK)
    assert result.max_abs_diff == pytest.approx(0.2) and result.id_mismatches == 0


@pytest.mark.parametrize(("ids", "logprobs", "why"), [
    ([5, 6, 7], [-0.5, -1.0, -2.3], "differ from the trainer's by up to 0.3000"),
    ([5, 6, 8], [-0.5, -1.0, -2.0], "greedy probe token 2 is 8 on the server but 7"),
    ([5, 6], [-0.5, -1.0], "asked for 3 tokens with EOS ignored and got 2"),
    ([5, 6, 7], [-0.5, float("nan"), -2.0], "differ from the trainer's"),
])
def test_a_gap_a_confident_other_token_or_a_short_answer_is_a_push_not_applied(ids: list[int],
                                                                               logprobs: list[float],
                                                                               why: str) -> None:
    with pytest.raises(PushNotApplied, match=rf"{URL} did not apply weight push version 3 \(adapter agentrl-v3\)"
                                             rf": .*{why}") as err:
        compare(URL, "agentrl-v3", 3, ids, logprobs, TRAINER, CHECK)
    assert (err.value.url, err.value.adapter, err.value.version) == (URL, "agentrl-v3", 3)


def test_a_repush_is_compared_up_to_where_its_ids_leave_the_scored_ones() -> None:
    # the push scored [5, 6, 7]; the re-pushed server picks 9 at the near tie (token 1): tokens after it had
    # another prefix and are not compared (their log-probs may be anything)
    result = compare(URL, "agentrl-v3", 3, [5, 9, 4], [-0.5, -3.0, -9.0], TRAINER, CHECK, scored_ids=[5, 6, 7])
    assert result.max_abs_diff == pytest.approx(0.0)
    with pytest.raises(PushNotApplied, match="greedy probe token 0 is 4"):  # a confident token differs: not applied
        compare(URL, "agentrl-v3", 3, [4, 6, 7], [-0.5, -1.0, -2.0], TRAINER, CHECK, scored_ids=[5, 6, 7])


def test_the_vllm_spec_refuses_a_policy_without_lora_at_config_time() -> None:
    spec = VLLMEngineSpec(["http://127.0.0.1:8000"])
    spec.check_policy(uses_lora=True)
    with pytest.raises(ValueError, match=r"no LoRA \(model.policy.init_args.lora\).*reload_weights"):
        spec.check_policy(uses_lora=False)
