"""Bring your own agent: an OpenAI-compatible gateway over the run's rollout engine.

An agent the user already has (an OpenAI SDK loop, any program) plays one episode per dataset row
against the gateway the run serves (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``
on loopback, with a per-run random key). Every call is recorded as the ids the engine was fed and
sampled, their log-probs and policy versions; calls whose prompt ids extend the previous call's
prompt + sampled ids merge into one trajectory with the multi-turn loss mask, the others become
samples of their own sharing the episode's reward. Nothing is re-tokenized. See ``docs/agents.md``
("bring your own agent").
"""
