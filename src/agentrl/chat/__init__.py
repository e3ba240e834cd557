"""Layer `chat`: everything that turns chat messages into prompt text and model text back into messages — chat
template rendering (with the Hermes tool block for templates that ignore tools) and tool-call formats. Pure
string/tokenizer code: used by agents, environments, the server and the adapters; imports no engine or model."""
