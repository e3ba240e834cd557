"""Layer `models`: the networks. `Policy` (a causal LM from a hub id, folder or GGUF file, optional LoRA; scores
recorded token ids), `TurnCritic` (V(s_n) at a turn's last prompt token) and model loading. Imports only the
core types; knows nothing of engines, agents or training."""
