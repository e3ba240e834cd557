"""Layer `agents`: what runs an episode. The `Agent` protocol (``run(task, llm) -> Outcome``), the episode's
`LLMClient` (the model as an agent sees it: renders chats, calls the engine, records every call as a token-exact
`Turn`, replays a trunk for RTPO siblings), `EnvAgent`, the built-in loop over a text environment, and `HTTPAgent`,
any agent that speaks the OpenAI API (its episode-scoped endpoints come from the serve layer via `EpisodeRoutes`).
Imports engines (to call), envs (to drive) and chat (to render); never collect, serve or training."""
