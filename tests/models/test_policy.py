"""Policy and critic: loading, LoRA, reference log-probs, and where the critic reads V(s_n)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from agentrl.models.critic import TurnCritic
from agentrl.models.loading import ModelLoadError, load_model
from agentrl.models.policy import LoRASettings, Policy


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 259, (1, n), generator=g)


def test_tiny_policy_logprobs_only_at_positions(tiny_policy: Policy) -> None:
    ids = _ids(12)
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, 8:] = True
    out = tiny_policy.token_logprobs(ids, torch.ones_like(ids), pos, with_entropy=True)
    full = torch.log_softmax(tiny_policy.model(input_ids=ids).logits.float(), -1)
    expected = full[0, 7:11].gather(-1, ids[0, 8:12].unsqueeze(-1)).squeeze(-1)
    assert_close(out.logprobs[0, 8:], expected, atol=1e-5, rtol=1e-5)
    assert bool((out.logprobs[0, :8] == 0).all())
    assert out.entropy is not None and bool((out.entropy[0, 8:] > 0).all())
    with pytest.raises(ValueError, match="position 0"):
        tiny_policy.token_logprobs(ids, torch.ones_like(ids), torch.ones_like(pos))


def test_chunked_lm_head_gives_the_unchunked_values_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LM head runs on `LOGIT_CHUNK_ROWS` scored positions at a time, checkpointed (recomputed in backward):
    log-probs, entropy and every gradient equal a hand-written reference (the model's full logits, tempered
    log-softmax, gathered); the entropy carries a gradient only with ``entropy_grad``."""
    from agentrl.models import policy as policy_module

    ids = torch.cat([_ids(20, seed=1), _ids(20, seed=2)])
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[:, 5:] = True  # 30 scored positions: chunks of 7 leave a remainder
    weights = torch.linspace(-1, 1, ids.numel()).view_as(ids)
    temperature = 0.7

    def grads_of(policy: Policy, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        loss.backward()
        return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}

    def reference(entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        policy = Policy("tiny-random", seed=0)
        logp_all = torch.log_softmax(policy.model(input_ids=ids).logits.float()[:, :-1] / temperature, -1)
        logp = torch.zeros(ids.shape).masked_scatter(
            pos, logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)[pos[:, 1:]])
        ent_all = -(logp_all.exp() * logp_all).sum(-1)
        entropy = torch.zeros(ids.shape).masked_scatter(pos, ent_all[pos[:, 1:]])
        loss = (logp * weights).sum() + (0.1 * entropy.sum() if entropy_grad else 0.0)
        return logp.detach(), entropy.detach(), grads_of(policy, loss)

    def chunked(entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        monkeypatch.setattr(policy_module, "LOGIT_CHUNK_ROWS", 7)
        policy = Policy("tiny-random", seed=0)
        out = policy.token_logprobs(ids, torch.ones_like(ids), pos, temperature=temperature, with_entropy=True,
                                    entropy_grad=entropy_grad)
        assert out.entropy is not None
        assert out.entropy.requires_grad == entropy_grad
        loss = (out.logprobs * weights).sum() + (0.1 * out.entropy.sum() if entropy_grad else 0.0)
        return out.logprobs.detach(), out.entropy.detach(), grads_of(policy, loss)

    for entropy_grad in (False, True):
        want, got = reference(entropy_grad), chunked(entropy_grad)
        assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
        assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
        assert got[2].keys() == want[2].keys() and len(want[2]) > 10
        for name in want[2]:
            assert_close(got[2][name], want[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_right_padding_does_not_change_logprobs(tiny_policy: Policy) -> None:
    ids = _ids(10)
    pos = torch.zeros(1, 10, dtype=torch.bool)
    pos[0, 6:] = True
    alone = tiny_policy.token_logprobs(ids, torch.ones_like(ids), pos).logprobs
    padded_ids = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 10, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)], 1)
    padded_pos = torch.cat([pos, torch.zeros(1, 5, dtype=torch.bool)], 1)
    padded = tiny_policy.token_logprobs(padded_ids, mask, padded_pos).logprobs
    assert_close(padded[:, :10], alone, atol=1e-5, rtol=1e-5)


def test_lora_trains_only_adapters_and_reference_is_the_base() -> None:
    base = Policy("tiny-random", seed=3)
    lora = Policy("tiny-random", seed=3, lora=LoRASettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    names = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    ids = _ids(16, seed=1)
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, 10:] = True
    mask = torch.ones_like(ids)
    base_lp = base.token_logprobs(ids, mask, pos).logprobs
    # LoRA B starts at zero: the adapted model equals the base
    assert_close(lora.token_logprobs(ids, mask, pos).logprobs, base_lp)
    with torch.no_grad():
        for n, p in lora.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    moved = lora.token_logprobs(ids, mask, pos).logprobs
    assert (moved - base_lp).abs().max() > 1e-3
    with torch.no_grad(), lora.adapter_disabled():
        ref = lora.token_logprobs(ids, mask, pos).logprobs
    assert_close(ref, base_lp, atol=1e-6, rtol=1e-6)
    with pytest.raises(RuntimeError, match="need LoRA"), base.adapter_disabled():
        pass


def test_lora_settings_validation() -> None:
    with pytest.raises(ValueError, match="lora.r"):
        LoRASettings(r=0)
    with pytest.raises(ValueError, match="target_modules"):
        LoRASettings(target_modules=[])


@pytest.mark.parametrize("shared", [False, True])
def test_critic_reads_last_prompt_token(tiny_policy: Policy, shared: bool) -> None:
    """V(s_n) sits at the first response token and depends only on the prompt: changing the response must
    not change it. (A critic reading the response's last token would fail this.)"""
    critic = TurnCritic(tiny_policy, shared_backbone=shared)
    with torch.no_grad():  # a trained head (the critic starts neutral, V = 0 everywhere, which reads nothing)
        critic.head.weight.normal_(std=tiny_policy.hidden_size**-0.5, generator=torch.Generator().manual_seed(0))
    prompt = _ids(9, seed=2)
    resp_a, resp_b = _ids(5, seed=3), _ids(5, seed=4)
    mask = torch.ones(1, 14, dtype=torch.long)
    va = critic(torch.cat([prompt, resp_a], 1), mask)
    vb = critic(torch.cat([prompt, resp_b], 1), mask)
    first_response = 9
    assert_close(va[0, first_response], vb[0, first_response])
    assert (va[0, -1] - vb[0, -1]).abs() > 0  # later positions do see the response
    hidden = critic.hidden_states(prompt, torch.ones_like(prompt))
    assert_close(va[0, first_response], critic.head(hidden[0, -1]).squeeze(-1), atol=1e-6, rtol=1e-6)


def test_critic_copy_is_separate_and_initialised_from_policy(tiny_policy: Policy) -> None:
    critic = TurnCritic(tiny_policy)
    pol = dict(tiny_policy.backbone.named_parameters())
    for name, p in critic.backbone.named_parameters():  # type: ignore[union-attr]
        assert_close(p, pol[name])
        assert p.data_ptr() != pol[name].data_ptr()
    shared = TurnCritic(tiny_policy, shared_backbone=True)
    assert [n for n, _ in shared.named_parameters()] == ["head.weight", "head.bias"]


def test_critic_with_lora_policy_trains_adapters_and_head() -> None:
    policy = Policy("tiny-random", lora=LoRASettings(r=2, target_modules=["q_proj"]))
    critic = TurnCritic(policy)
    names = [n for n, p in critic.named_parameters() if p.requires_grad]
    assert "head.weight" in names and all("lora_" in n or n.startswith("head.") for n in names)


def test_unknown_model_path_is_a_clear_error(tmp_path: object) -> None:
    with pytest.raises(ModelLoadError, match="no-such-model"):
        load_model("/tmp/definitely/no-such-model")
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model("/tmp/missing-file.gguf")


def test_gguf_of_unsupported_architecture_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gguf
    import numpy as np

    path = tmp_path / "weird.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba-weird")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="could not load GGUF"):
        load_model(str(path))


@pytest.mark.slow
def test_smollm2_loads_from_gguf(smollm2_policy: Policy) -> None:
    model = smollm2_policy.model
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == 49152
    assert sum(p.numel() for p in model.parameters()) > 100e6
    ids = smollm2_policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert smollm2_policy.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert 2 in smollm2_policy.stop_token_ids  # <|im_end|>
